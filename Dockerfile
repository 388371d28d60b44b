# The llmvalve control plane image: `llmvalve serve` by default. The same image runs the
# simulated GPU backend (`llmvalve sim-backend`) for compose's `sim` profile.
#   docker build -t llmvalve:0.1.0 .
# Ports: 9100 admin HTTP (/metrics, /healthz, /readyz; /status and /dashboard with the admin
# token). The data plane (Envoy's ext_authz on 127.0.0.1:9001, its access log on
# 127.0.0.1:9000) and, without --admin-token-file, the admin gRPC API (127.0.0.1:9101) listen on
# loopback only: run Envoy in this container's network namespace (compose.yaml, a Kubernetes
# pod). docs/deployment.md has the details.
FROM python:3.12-slim
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin llmvalve
WORKDIR /src
# Every dependency, the build backend's included, at the version and hashes requirements.lock
# pins (`make lock` regenerates it from pyproject.toml): every rebuild installs the same files,
# and a file changed on the index fails the build. The project itself then installs nothing more.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf /src
WORKDIR /
USER 10001
EXPOSE 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/readyz', timeout=2)"]
ENTRYPOINT ["llmvalve"]
CMD ["serve", "--policy", "/etc/llmvalve/policy.yaml", "--http", "127.0.0.1:9001", "--grpc", "127.0.0.1:9000", "--admin", "0.0.0.0:9100"]
