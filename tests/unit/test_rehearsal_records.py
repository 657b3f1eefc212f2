"""What a recorded compile line says about itself, for both ways DeepSpeed's setup.py compiles."""

from mlstack_ds.rehearsal.records import Record


def _compile(*argv: str) -> Record:
    return Record("hipcc", "compile", ("hipcc", *argv), "/t/a.o", "/t")


def test_the_source_of_a_setuptools_compile_follows_its_one_dash_c():
    assert _compile("-I/inc", "-c", "/src/a.hip", "-o", "/t/a.o", "-O3").source == "/src/a.hip"


def test_the_source_of_a_ninja_compile_follows_torchs_doubled_dash_c():
    """torch's ninja rule is `$nvcc $cuda_cflags -c $in ...` and its cflags already end in `-c`: the
    rehearsal took `-c` for the source, and the syntax check ran hipcc on no input at all."""
    assert _compile("-I/inc", "-c", "-c", "/src/a.hip", "-o", "/t/a.o").source == "/src/a.hip"


def test_a_line_without_dash_c_has_no_source():
    assert _compile("-shared", "/t/a.o", "-o", "/t/a.so").source is None
