# The two commands: `make up` runs the embedded stack, `make test` runs the tests.
# Each creates .venv inside the checkout and installs the project on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint install clean protos browser lock

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/llmvalve up $(if $(POLICY),--policy $(POLICY))

# Two pytest workers (pytest-xdist), each running whole test files (an e2e module's stack is
# started once): alone the suite keeps one core busy about three quarters of the time (real
# Envoy, backends and waits scaled in wall time), so a second worker fills the idle part.
test: $(STAMP) browser
	$(BIN)/ruff check src tests
	$(BIN)/python protos/generate.py --check
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile

# The dashboard test renders the page in headless Chromium: install Debian's where we can
# (root and apt); never fail here — without it that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      --no-install-recommends chromium >/dev/null) ; } || \
	  echo "make: no chromium (the dashboard test will be skipped)"

# Regenerate the admin API's Python code (src/llmvalve/admin/v1) from protos/ (grpcio-tools).
protos: $(STAMP)
	$(BIN)/python protos/generate.py

# Regenerate requirements.lock, the image's dependencies pinned with their hashes (Dockerfile),
# from pyproject.toml's, the build backend's included, for the image's Python (uv resolves for
# another interpreter and platform than this one).
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet uv==0.13.9
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))[ \
	  "build-system"]["requires"], sep="\n")' | $(BIN)/uv pip compile --quiet --generate-hashes \
	  --python-version 3.12 --python-platform x86_64-manylinux_2_31 \
	  --custom-compile-command 'make lock' -o requirements.lock pyproject.toml -

lint: $(STAMP)
	$(BIN)/ruff check src tests

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
