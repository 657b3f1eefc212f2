"""Stand-in of the `rocm-sdk` command: path, version, init, targets. `rocm-sdk path --root` expands the devel
tarball first, as the real command does."""
import json
import os
import sys
import tarfile

import rocm_sdk

HERE = os.path.dirname(os.path.abspath(__file__))
SITE = os.path.dirname(HERE)
DEVEL = os.path.join(SITE, "_rocm_sdk_devel")


def devel_root():
    try:
        import rocm_sdk_devel
    except ModuleNotFoundError:
        print("ERROR: Could not load the `rocm[devel]` package, which is required to access runtime tools and "
              "development files. Please install it with your package manager (pip, uv, etc)", file=sys.stderr)
        sys.exit(1)
    tarball = os.path.join(os.path.dirname(rocm_sdk_devel.__file__), "_devel.tar")
    if os.path.exists(tarball):
        with tarfile.open(tarball) as archive:
            archive.extractall(SITE)
        os.unlink(tarball)
    return DEVEL


def targets():
    with open(os.path.join(HERE, "_standin.json"), encoding="utf-8") as values:
        return json.load(values)["targets"]


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["version"]:
        print(rocm_sdk.__version__)
    elif args[:1] == ["path"] and args[1:2] in (["--root"], ["--bin"], ["--cmake"]):
        root = devel_root()
        paths = {"--root": root, "--bin": os.path.join(root, "bin"), "--cmake": os.path.join(root, "lib", "cmake")}
        print(paths[args[1]])
    elif args[:1] == ["init"]:
        root = devel_root()
        if "--quiet" not in args:
            print(f"Devel links initialized in '{root}'")
    elif args[:1] == ["targets"]:
        print(targets())
    else:
        print("usage: rocm-sdk {path,version,init,targets} ...", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
