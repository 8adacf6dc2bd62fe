# Sourced by the scripts: installs the Debian packages reccl's build needs, only those missing.
# Tools count as present when they are on PATH however they were installed (e.g. a pip cmake on a
# GPU machine); libraries when dpkg knows them. Where apt-get cannot reach a mirror (a machine with
# no network), it warns and goes on with what is there: the build then names anything missing.
reccl_install_deps() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  local p
  for p in doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libbenchmark-dev libibverbs-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
    echo "warning: could not install ${missing[*]}; continuing with what this machine has" >&2
  fi
}
