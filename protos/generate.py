"""Compile the project's protos with grpcio-tools into src/ (`make protos`).

    python protos/generate.py            # regenerate src/llmvalve/admin/v1/*_pb2*.py
    python protos/generate.py --check    # exit 1 if the committed code is not what the
                                         # .proto files compile to

The generated modules are committed, so installing llmvalve needs no code generator and the
gencode matches the protobuf runtime floor in pyproject.toml. `--check` compares the
descriptors (what the code means), not the text, which differs between grpcio-tools releases.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
SRC = ROOT / "src"
FILES = ("llmvalve/admin/v1/admin.proto",)


def compile_to(out: Path) -> list[Path]:
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    written = []
    for name in FILES:
        args = ["grpc_tools.protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}",
                f"--pyi_out={out}", f"--grpc_python_out={out}", str(PROTOS / name)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {name}")
        stem = name.removesuffix(".proto")
        written += [out / f"{stem}_pb2.py", out / f"{stem}_pb2.pyi", out / f"{stem}_pb2_grpc.py"]
    return written


def descriptor_of(path: Path) -> bytes:
    """The serialized FileDescriptorProto a generated _pb2.py module carries."""
    spec = importlib.util.spec_from_file_location(f"_check_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    text = path.read_text()
    start = text.index("AddSerializedFile(") + len("AddSerializedFile(")
    end = text.index(")\n", start)
    return eval(text[start:end])  # a bytes literal written by protoc


def check() -> list[str]:
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in compile_to(Path(tmp)):
            committed = SRC / fresh.relative_to(tmp)
            if not committed.exists():
                problems.append(f"{committed.relative_to(ROOT)} is missing")
            elif fresh.name.endswith("_pb2.py"):
                if descriptor_of(fresh) != descriptor_of(committed):
                    problems.append(f"{committed.relative_to(ROOT)} is stale")
            elif fresh.name.endswith("_grpc.py"):
                methods = [line.strip() for line in fresh.read_text().splitlines()
                           if line.strip().startswith("'/")]
                old = [line.strip() for line in committed.read_text().splitlines()
                       if line.strip().startswith("'/")]
                if methods != old:
                    problems.append(f"{committed.relative_to(ROOT)} is stale")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(f"protos: {p}; run `make protos`", file=sys.stderr)
        return 1 if problems else 0
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in compile_to(Path(tmp)):
            target = SRC / fresh.relative_to(tmp)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh, target)
            print(f"wrote {target.relative_to(ROOT)}")
    for package in ("llmvalve/admin", "llmvalve/admin/v1"):
        init = SRC / package / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from protos/ (python protos/generate.py)."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
