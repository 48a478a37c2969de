# Shared setup steps for the scripts in scripts/: each installs only what is missing, from
# Debian's packages, crates.io and PyPI, so a fresh machine needs nothing done by hand.

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # Packages installed for the tests must not start services (an sshd on port 22, say).
  local policy=/usr/sbin/policy-rc.d made_policy="" rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod +x "$policy"
    made_policy=1
  fi
  { $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null; } || rc=$?
  [ -z "$made_policy" ] || $sudo rm -f "$policy"
  return $rc
}

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    apt_install cargo rustc
  fi
  command -v cargo >/dev/null 2>&1 || { echo "setup: no Rust toolchain (cargo) could be installed" >&2; exit 1; }
}

# cargo-fuzz (for scripts/fuzz), from crates.io.
ensure_cargo_fuzz() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz >/dev/null
  fi
}

# Installs REQUIREMENTS into .venv unless MARKER is newer than every one of FILES and CHECK (a
# Python statement) succeeds, then installs bench/ and training/ from the checkout and touches
# MARKER: ensure_python_env and ensure_training_env below.
pip_install_once() {
  local venv="$repo_root/.venv" marker="$1" check="$2" requirements="$3" stale=""
  shift 3
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$venv"; }
  fi
  for f in "$@"; do
    [ "$repo_root/$f" -nt "$venv/$marker" ] && stale=1
  done
  if [ -n "$stale" ] || ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    if ! { "$venv/bin/python" -m pip install -q --upgrade pip &&
           "$venv/bin/python" -m pip install -q -r "$repo_root/$requirements" &&
           "$venv/bin/python" -m pip install -q --no-deps -e "$repo_root/bench" -e "$repo_root/training"; } > "$venv/pip.log" 2>&1; then
      cat "$venv/pip.log" >&2
      echo "setup: installing the Python environment failed (log above)" >&2
      exit 1
    fi
    touch "$venv/$marker"
  fi
}

# The environment of bench/ and of training/ without PyTorch (training/requirements.txt): what
# the test command and the benchmark scripts need.
ensure_python_env() {
  pip_install_once .installed "import xfer_bench, xfer_training, pytest, ruff" \
    training/requirements.txt bench/pyproject.toml training/pyproject.toml training/requirements.txt
}

# The same with what training needs as well (training/requirements-train.txt: PyTorch with its
# CUDA wheels, since PyPI has no CPU-only build, Stable-Baselines3, TensorBoard; about 4.5 GB).
ensure_training_env() {
  ensure_python_env
  pip_install_once .installed-train "import torch, stable_baselines3, onnxscript, tensorboard" \
    training/requirements-train.txt training/pyproject.toml training/requirements.txt \
    training/requirements-train.txt
}

# Exports what building xfer with the tch feature needs: torch-sys finds the libtorch of the
# environment's PyTorch through `python`, and the binary loads it from there.
use_pytorch_libtorch() {
  export PATH="$repo_root/.venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1
  local lib
  lib="$("$repo_root/.venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
