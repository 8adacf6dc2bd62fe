# Sourced by the scripts: installs the Debian packages reccl's build needs, only those missing.
reccl_install_deps() {
  local pkgs=(cmake ninja-build g++ doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev libbenchmark-dev libibverbs-dev)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}
