"""Build small extensions with the build_ext class DeepSpeed's setup.py makes, with setuptools' parallel option.

Runs in the test interpreter with a DeepSpeed source tree on PYTHONPATH (its `accelerator` package gives
torch's BuildExtension, as in setup.py). The statements of the tree's setup.py that make
`cmdclass['build_ext']` are executed as they are (plus the function patch 0019 adds, when there), so the
pristine and the patched tree are each tested with their own code. The extensions are plain C (Python.h
only) so that compiling them takes a fraction of a second; the build goes through ninja (DS_ENABLE_NINJA=1)
in a scratch project.

argv: <setup.py> <project dir> <parallel> <ext>[:bad|:shared] ...   (`:bad` gives that extension a syntax
error; `:shared` adds shared.c, a source that takes about a second to compile, to that extension's sources)
Prints one line `RESULT {json}`: exit status, which extensions were built, where build.ninja files were
written, the lines naming a failed extension, and each extension's span: from its first object file's
modification time to its library's.
"""

import ast
import contextlib
import io
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup

SOURCE = """
#include <Python.h>
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&module); }
%(broken)s
"""

# About a second of compiling: long enough that two ops compiling it at once overlap.
SHARED = "".join(f"int shared_{i}(int x) {{ return x * {i} + (x >> 3); }}\n" for i in range(2000))


def build_ext_class(setup_py):
    """Execute the setup.py statements that define `cmdclass['build_ext']`, nothing else."""
    tree = ast.parse(Path(setup_py).read_text())
    wanted = []
    for node in tree.body:
        helper = isinstance(node, ast.FunctionDef) and node.name in ("is_env_set", "one_build_dir_per_op")
        if helper or (isinstance(node, ast.If) and "cmdclass['build_ext']" in ast.unparse(node)):
            wanted.append(node)
    namespace = {"os": os, "torch_available": True, "cmdclass": {}}
    from accelerator import get_accelerator

    namespace["get_accelerator"] = get_accelerator
    exec(compile(ast.Module(body=wanted, type_ignores=[]), setup_py, "exec"), namespace)
    return namespace["cmdclass"]["build_ext"]


def main():
    setup_py, project, parallel, *specs = sys.argv[1:]
    build_class = build_ext_class(setup_py)
    project = Path(project)
    project.mkdir(parents=True, exist_ok=True)
    extensions = []
    (project / "shared.c").write_text(SHARED)
    for spec in specs:
        name, _, kind = spec.partition(":")
        (project / f"{name}.c").write_text(SOURCE % {"name": name, "broken": "this is not C;" if kind == "bad" else ""})
        extensions.append(Extension(name, [f"{name}.c", *(["shared.c"] if kind == "shared" else [])]))
    os.chdir(project)
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out):
        try:
            setup(name="probe", version="0", ext_modules=extensions, cmdclass={"build_ext": build_class},
                  script_args=["build_ext", "--parallel", parallel], zip_safe=False)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # the build's own error is the result
            status = 1
            print(f"raised {type(exc).__name__}: {exc}")
    built = sorted(p.name.split(".")[0] for p in project.glob("build/lib*/*.so"))
    ninja_files = sorted(str(p.relative_to(project / "build")) for p in project.glob("build/temp*/**/build.ninja"))
    failed_lines = [ln for ln in out.getvalue().splitlines() if "extension failed" in ln]
    spans = {}
    for library in project.glob("build/lib*/*.so"):
        name = library.name.split(".")[0]
        objects = [o.stat().st_mtime for o in project.glob(f"build/temp*/{name}/**/*.o")]
        spans[name] = [min(objects, default=library.stat().st_mtime), library.stat().st_mtime]
    print("RESULT " + json.dumps({"status": status, "built": built, "ninja_files": ninja_files,
                                  "failed_lines": failed_lines, "spans": spans}))


if __name__ == "__main__":
    main()
