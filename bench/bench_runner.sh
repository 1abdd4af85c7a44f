# Sourced by bench/run_*.sh, which take BUILD_DIR OUT_DIR [extra Google Benchmark flags...]:
#   source "$(dirname "${BASH_SOURCE[0]}")/bench_runner.sh" "$@"
# sets build_dir, out_dir (created), extra_flags (an array) and here (bench/), and defines
#   run_bench NAME EXE [env arguments...]  runs EXE (if built) with the caller's `flags` and env's arguments
#                                          (VAR=value, -u VAR), JSON into OUT_DIR/NAME.json, text into
#                                          OUT_DIR/NAME.txt; appends the JSON to `jsons`
#   print_table SCRIPT                     SCRIPT's Markdown table of `jsons`, also into OUT_DIR/summary.md,
#                                          or exit 1 when nothing ran
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [benchmark flags...]" >&2
  exit 2
fi
build_dir=$1
out_dir=$2
extra_flags=("${@:3}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out_dir"
jsons=()

run_bench() {
  local name=$1 exe=$2
  shift 2
  if [[ ! -x "$exe" ]]; then
    echo "$0: $exe not built, skipped" >&2
    return
  fi
  echo "$0: running $name" >&2
  env "$@" "$exe" "${flags[@]}" --benchmark_out="$out_dir/$name.json" >"$out_dir/$name.txt"
  jsons+=("$out_dir/$name.json")
}

print_table() {
  if [[ ${#jsons[@]} -eq 0 ]]; then
    echo "$0: nothing ran (build the benchmarks first)" >&2
    exit 1
  fi
  python3 "$here/$1" "${jsons[@]}" | tee "$out_dir/summary.md"
}
