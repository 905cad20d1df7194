#!/usr/bin/env bash
# Build and test kubewasm guests written in Python.
#
#   guest-sdk/python/build.sh install                 install the pinned tools (idempotent)
#   guest-sdk/python/build.sh <guest-dir> <out.wasm>  build one guest into a component
#   guest-sdk/python/build.sh test [pytest args...]   pytest: the SDK, then every guests/python-*
#   guest-sdk/python/build.sh bindings <dir>          write the generated WIT bindings, to read
#
# The tools (componentize-py, pytest, PyYAML; exact versions below) go into a venv in
# ${KUBEWASM_CACHE:-$HOME/.cache/kubewasm}/python/<componentize-py version>/, outside the
# checkout. Python: $PYTHON, else python3.11, else python3 if it is 3.11 or newer.
#
# A guest directory has a pyproject.toml whose [tool.kubewasm] `module` names its Python module
# (a file <module>.py or a package <module>/ beside it) with one function decorated with
# @kubewasm.reconciler. The bindings are generated from guest-sdk/wit/kubewasm.wit, the
# project's one WIT file, at every build; the component holds the guest module, the `kubewasm`
# package and what they import, nothing else from the checkout (no tests).
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
PYTEST_VERSION=9.2.0
PYYAML_VERSION=6.0.4
# `controller` and `prepare` (guest-sdk/wit/kubewasm.wit): the host calls `prepare` on instances
# it makes ahead, which moves componentize-py's setup of an instance off the reconcile's path.
WORLD=prepared-controller

sdk=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$sdk/../.." && pwd)
wit="$repo/guest-sdk/wit/kubewasm.wit"
cache="${KUBEWASM_CACHE:-$HOME/.cache/kubewasm}"
venv="$cache/python/$COMPONENTIZE_PY_VERSION"
requirements="componentize-py==$COMPONENTIZE_PY_VERSION pytest==$PYTEST_VERSION PyYAML==$PYYAML_VERSION"

say() { printf '%s\n' "build.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        echo "$PYTHON"
    elif command -v python3.11 >/dev/null; then
        echo python3.11
    elif command -v python3 >/dev/null \
        && python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo python3
    else
        die "needs Python 3.11 or newer (python3.11, or set PYTHON)"
    fi
}

# The venv with the pinned tools; a stamp file says what was installed, so a second run does
# nothing. Serialized with flock when it exists (two guests built at once by make -j).
install() {
    local stamp="$venv/.kubewasm-installed"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$requirements" && -x "$venv/bin/componentize-py" ]]; then
        return
    fi
    mkdir -p "$cache/python"
    if command -v flock >/dev/null; then
        exec 9>"$cache/python/.lock"
        flock 9
        if [[ -f "$stamp" && "$(cat "$stamp")" == "$requirements" && -x "$venv/bin/componentize-py" ]]; then
            return
        fi
    fi
    local python
    python=$(pick_python)
    if [[ ! -x "$venv/bin/python" ]]; then
        say "creating a venv in $venv with $python ($("$python" --version 2>&1))"
        "$python" -m venv "$venv" \
            || die "'$python -m venv' failed (on Debian: apt-get install python3.11-venv)"
    fi
    say "installing $requirements into $venv"
    # shellcheck disable=SC2086 # the requirements are words
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $requirements
    echo "$requirements" >"$stamp"
    say "installed: $("$venv/bin/componentize-py" --version)"
}

# The module a guest directory names in its pyproject.toml ([tool.kubewasm] module).
guest_module() {
    "$venv/bin/python" - "$1/pyproject.toml" <<'EOF'
import re, sys, tomllib
path = sys.argv[1]
try:
    with open(path, "rb") as f:
        module = tomllib.load(f)["tool"]["kubewasm"]["module"]
except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
    sys.exit(f"{path}: expected [tool.kubewasm] module = \"<python module>\" ({e!r})")
if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", module):
    sys.exit(f"{path}: [tool.kubewasm] module {module!r} is not a Python module name")
taken = {"kubewasm", "kubewasm_entry", "wit_world", "componentize_py_types",
         "componentize_py_runtime", "componentize_py_async_support", "poll_loop"}
if module in taken:
    sys.exit(f"{path}: [tool.kubewasm] module {module!r} is a name the build uses; rename it")
print(module)
EOF
}

build() {
    local guest_dir out module staging started elapsed size
    guest_dir=$(cd "$1" && pwd) || die "no guest directory $1"
    out=$2
    install
    module=$(guest_module "$guest_dir")
    staging=$(mktemp -d "${TMPDIR:-/tmp}/kubewasm-python-build.XXXXXX")
    # shellcheck disable=SC2064 # expanded now: $staging is local
    trap "rm -rf '$staging'" EXIT

    # What goes into the component: the SDK package, the guest's module, and an entry that
    # imports the guest (registering its reconciler) and exports the WIT world.
    copy_tree() { (cd "$1" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - "$2") | tar -C "$staging" -xf -; }
    copy_tree "$sdk" kubewasm
    if [[ -f "$guest_dir/$module.py" ]]; then
        copy_tree "$guest_dir" "$module.py"
    elif [[ -d "$guest_dir/$module" ]]; then
        copy_tree "$guest_dir" "$module"
    else
        die "$guest_dir has neither $module.py nor $module/ (pyproject.toml names module $module)"
    fi
    cat >"$staging/kubewasm_entry.py" <<EOF
# Written by guest-sdk/python/build.sh: the component's entry point.
import $module  # noqa: F401  registers its @kubewasm.reconciler
import kubewasm.wire

kubewasm.wire.exported()  # exactly one reconciler, or the build fails here
from kubewasm._guest import WitWorld, warm_up  # noqa: E402,F401  the reconcile export

warm_up()  # the SDK's half of a reconcile, specialized before the snapshot
EOF

    mkdir -p "$(dirname "$out")"
    say "building $guest_dir (module $module) into $out"
    say "  componentize-py $COMPONENTIZE_PY_VERSION, WIT $wit, world $WORLD"
    started=$(date +%s%N)
    # VIRTUAL_ENV names an empty site-packages, so that componentize-py adds none of ours
    # (pytest, PyYAML) to the component.
    mkdir -p "$staging/no-venv/lib/site-packages"
    (cd "$staging" && VIRTUAL_ENV="$staging/no-venv" "$venv/bin/componentize-py" \
        -d "$wit" -w "$WORLD" componentize -p "$staging" -o "$staging/out.wasm" kubewasm_entry)
    mv "$staging/out.wasm" "$out"
    elapsed=$(awk -v a="$started" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    size=$(wc -c <"$out")
    say "built $out: $size bytes in $elapsed s"
}

bindings() {
    install
    say "writing the bindings of $wit (world $WORLD) into $1"
    "$venv/bin/componentize-py" -d "$wit" -w "$WORLD" bindings "$1"
}

# pytest once per directory (the SDK, then each guest), each with its own pyproject.toml: two
# guests' tests never share a process or a module namespace.
test_all() {
    install
    local failed=() dir
    local dirs=("$sdk")
    for dir in "$repo"/guests/python-*/; do
        [[ -f "$dir/pyproject.toml" ]] && dirs+=("${dir%/}")
    done
    for dir in "${dirs[@]}"; do
        say "pytest ${dir#"$repo"/}"
        if ! (cd "$dir" && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest \
            -p no:cacheprovider "$@"); then
            failed+=("${dir#"$repo"/}")
        fi
    done
    if ((${#failed[@]})); then
        die "pytest failed in: ${failed[*]}"
    fi
    say "pytest passed in: ${dirs[*]#"$repo"/}"
}

case "${1:-}" in
    install) install ;;
    test) shift; test_all "$@" ;;
    bindings) [[ $# -eq 2 ]] || die "usage: build.sh bindings <dir>"; bindings "$2" ;;
    "" | -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) [[ $# -eq 2 ]] || die "usage: build.sh <guest-dir> <out.wasm> (or install, test, bindings)"
       build "$1" "$2" ;;
esac
