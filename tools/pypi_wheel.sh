# shellcheck shell=sh
# pypi_wheel NAME VERSION SHA256 DEST [PIP_OPTION...]: downloads the PyPI wheel NAME==VERSION with
# `python3 -m pip download --no-deps --only-binary=:all:` (so the configured index or mirror applies;
# PYTHON chooses another interpreter; PIP_OPTIONs such as -q or --platform P go to pip) and moves it
# to DEST if its sha256 is SHA256; otherwise it says why on stderr and returns 1. Nothing is
# installed. POSIX sh: source it (`. tools/pypi_wheel.sh`) from sh, dash or bash scripts.
pypi_wheel() {
  _name=$1 _ver=$2 _sha=$3 _dest=$4
  shift 4
  _py=${PYTHON:-python3}
  "$_py" -m pip --version >/dev/null 2>&1 || {
    echo "error: fetching PyPI $_name $_ver needs pip ($_py -m pip; Debian: apt-get install python3-pip)" >&2
    return 1; }
  _tmp=$(mktemp -d "$_dest.pip.XXXXXX") || return 1
  if ! "$_py" -m pip download --no-deps --only-binary=:all: --no-cache-dir --disable-pip-version-check \
      "$@" -d "$_tmp" "$_name==$_ver" >&2; then
    echo "error: pip could not download $_name==$_ver" >&2; rm -rf "$_tmp"; return 1
  fi
  set -- "$_tmp"/*.whl
  if [ $# -ne 1 ] || ! [ -f "$1" ]; then
    echo "error: pip download of $_name==$_ver gave no single wheel" >&2; rm -rf "$_tmp"; return 1
  fi
  if ! echo "$_sha  $1" | sha256sum -c - >/dev/null 2>&1; then
    echo "error: PyPI $_name $_ver: ${1##*/} has sha256 $(sha256sum "$1" | cut -d' ' -f1), expected $_sha" >&2
    rm -rf "$_tmp"; return 1
  fi
  mv "$1" "$_dest" && rm -rf "$_tmp"
}
