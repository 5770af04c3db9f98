# tools/tree_copy.sh - sourced by tools/sanitize.sh and tools/c_coverage.sh,
# which both build the extension in a throw-away copy of the repository and
# run pytest there.

# copy_tree ROOT DEST: the sources, without .git, build products, caches and
# virtual environments (the copy builds its own extension).
copy_tree() {
    mkdir -p "$2"
    tar -C "$1" \
        --exclude=./.git --exclude=./build --exclude=./dist --exclude=./.venv \
        --exclude='*.so' --exclude='*.pyd' --exclude='*.o' --exclude='*.gcda' \
        --exclude='*.gcno' --exclude=__pycache__ --exclude=./.hypothesis \
        --exclude=./.pytest_cache --exclude=./docs/_build --exclude='*.egg-info' \
        --exclude=./fuzz/build \
        -cf - . | tar -C "$2" -xf -
}

# assert_imports_copy PYTHON SRC: run from SRC (with SRC first on
# PYTHONPATH), `import layernorm_c` must find the copy's build, not an
# installed or editable one; prints which file it imported.
assert_imports_copy() {
    ( cd "$2" && "$1" -c "
import sys, layernorm_c._core as c
assert c.__file__.startswith(sys.argv[1]), 'imported ' + c.__file__ + ', not the copy'
print('using', c.__file__)
" "$2" )
}

# c_suite_files ROOT: the test files listed in tools/c_suite.txt, one a line.
c_suite_files() {
    grep -v -e '^#' -e '^$' "$1/tools/c_suite.txt"
}
