#!/usr/bin/env bash
# Instructions and allocations per call of the client_overhead variants, under callgrind.
#
# Builds the bench once, runs each variant (all of them, or those named) for two call
# counts under `valgrind --tool=callgrind` on the bench's single-threaded `--calls` mode,
# and divides the difference in instructions (and in allocations, which the bench counts)
# by the difference in calls, so that start-up cancels out. Each variant's ratio is taken
# against its baseline (`retry`, `shed`, `both` against `bare`; the deadline variants
# against `bare-deadline`; `replicas`, `retry-balance-list`, `retry-replicas` against
# `balance-list`; the peers `tower`, `tonic-shed`, `tower-both`, `resilience`,
# `resilience-shed`, `resilience-both` against `bare`) and, where it has one, its rival
# (`retry-deadline` and `retry-attempt` against `tower-retry`, `retry-replicas` against
# `retry-balance-list`, each peer against the stormguard variant doing its job); the bench's
# `--list` says which is which, and baselines and rivals of the variants named are run too.
#
# Usage: benches/callgrind.sh [--json] [--calls N1,N2] [--features F] [--keep DIR] [--valgrind-arg A]... [VARIANT...]
#   --json           print the table as a JSON array instead of text
#   --features F     build the bench with cargo features F (`otel-examples` adds the
#                    `retry-prometheus` and `shed-prometheus` variants: the layers recording
#                    into a meter with OpenTelemetry's Prometheus exporter registered)
#   --calls N1,N2    the two call counts (default 2000,4000)
#   --keep DIR       keep the callgrind output files in DIR (callgrind.VARIANT.N.out), for
#                    `callgrind_annotate`; build with CARGO_PROFILE_BENCH_DEBUG=line-tables-only
#                    in the environment to get file:line in them
#   --valgrind-arg A pass A to valgrind (repeatable)
#
# Where a variant's allocations come from: keep the files with malloc split by call chain,
#   CARGO_PROFILE_BENCH_DEBUG=line-tables-only benches/callgrind.sh --keep /tmp/cg \
#       --valgrind-arg --separate-callers12=malloc retry-deadline
#   callgrind_annotate --tree=caller /tmp/cg/callgrind.retry-deadline.4000.out |
#       grep -B1 "^ *[0-9,]* ([ 0-9.]*%)  \*  .*malloc'"
# Each `* ...malloc'f'g'...` line is one call chain, innermost first, and the `<` line above
# it says how many times it ran (`(8,000x)`); compare with the baseline at both counts.
#
# Instructions count the whole process: the client, the loopback server and the runtime.
set -euo pipefail

cd "$(dirname "$0")/.."

json=false
calls="2000,4000"
features=()
keep=""
valgrind_args=()
asked=()
while (($#)); do
    case "$1" in
        --json) json=true ;;
        --calls)
            calls="${2:?--calls needs N1,N2}"
            shift
            ;;
        --features)
            features=(--features "${2:?--features needs a list}")
            shift
            ;;
        --keep)
            keep="${2:?--keep needs a directory}"
            shift
            ;;
        --valgrind-arg)
            valgrind_args+=("${2:?--valgrind-arg needs an argument}")
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        -*)
            echo "callgrind.sh: unknown option $1" >&2
            exit 2
            ;;
        *) asked+=("$1") ;;
    esac
    shift
done

IFS=, read -r n1 n2 extra <<<"$calls"
if [[ -n "${extra:-}" || ! "$n1" =~ ^[0-9]+$ || ! "${n2:-}" =~ ^[0-9]+$ ]] || ((n2 <= n1)); then
    echo "callgrind.sh: --calls wants two counts N1,N2 with N1 < N2, got $calls" >&2
    exit 2
fi
command -v valgrind >/dev/null || {
    echo "callgrind.sh: valgrind is not installed" >&2
    exit 1
}

bin=$(cargo bench --bench client_overhead --no-run --locked "${features[@]}" --message-format=json |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "client_overhead")
           | .executable // empty' | tail -1)
if [[ -z "$bin" || ! -x "$bin" ]]; then
    echo "callgrind.sh: cargo built no client_overhead executable" >&2
    exit 1
fi

# name -> baseline, rival, from the bench's own table.
declare -A baseline rival
order=()
while read -r name base riv; do
    baseline[$name]=$base
    rival[$name]=$riv
    order+=("$name")
done < <("$bin" --list)

declare -A want
if ((${#asked[@]} == 0)); then
    for v in "${order[@]}"; do want[$v]=1; done
else
    for v in "${asked[@]}"; do
        if [[ -z "${baseline[$v]:-}" ]]; then
            echo "callgrind.sh: unknown variant $v; expected one of: ${order[*]}" >&2
            exit 2
        fi
        want[$v]=1
        want[${baseline[$v]}]=1
        [[ "${rival[$v]}" == - ]] || want[${rival[$v]}]=1
    done
fi

out_dir=${keep:-$(mktemp -d)}
mkdir -p "$out_dir"
[[ -n "$keep" ]] || trap 'rm -rf "$out_dir"' EXIT

# One run: prints "instructions allocations bytes".
run() {
    local v=$1 n=$2 out="$out_dir/callgrind.$1.$2.out" log="$out_dir/valgrind.$1.$2.log" line instr
    if ! valgrind --tool=callgrind --callgrind-out-file="$out" ${valgrind_args[@]+"${valgrind_args[@]}"} \
        "$bin" --variant "$v" --calls "$n" \
        >"$out_dir/stdout.$v.$n" 2>"$log"; then
        echo "callgrind.sh: the run of $v with $n calls failed:" >&2
        grep -v '^==' "$log" | tail -5 >&2
        exit 1
    fi
    line=$(grep -m1 '^variant=' "$out_dir/stdout.$v.$n" || true)
    instr=$(awk '/^(summary|totals):/ { print $2; exit }' "$out")
    if [[ ! "$line" =~ allocations=([0-9]+)\ bytes=([0-9]+) || -z "$instr" ]]; then
        echo "callgrind.sh: the run of $v with $n calls printed no counts; see $log" >&2
        exit 1
    fi
    echo "$instr ${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
}

declare -A ipc apc bpc
for v in "${order[@]}"; do
    [[ -n "${want[$v]:-}" ]] || continue
    echo "callgrind.sh: $v ($n1 and $n2 calls)" >&2
    first=$(run "$v" "$n1")
    second=$(run "$v" "$n2")
    read -r i1 a1 b1 <<<"$first"
    read -r i2 a2 b2 <<<"$second"
    d=$((n2 - n1))
    ipc[$v]=$(awk -v a="$i1" -v b="$i2" -v d="$d" 'BEGIN { printf "%.0f", (b - a) / d }')
    apc[$v]=$(awk -v a="$a1" -v b="$a2" -v d="$d" 'BEGIN { printf "%.2f", (b - a) / d }')
    bpc[$v]=$(awk -v a="$b1" -v b="$b2" -v d="$d" 'BEGIN { printf "%.0f", (b - a) / d }')
done

# ratio A B: A / B to 3 places; delta A B: A - B.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
delta() { awk -v a="$1" -v b="$2" -v f="$3" 'BEGIN { printf f, a - b }'; }

rows=()
for v in "${order[@]}"; do
    [[ -n "${ipc[$v]:-}" ]] || continue
    b=${baseline[$v]} r=${rival[$v]}
    row="$v $b ${ipc[$v]} $(ratio "${ipc[$v]}" "${ipc[$b]}") $(delta "${ipc[$v]}" "${ipc[$b]}" %+.0f)"
    row+=" ${apc[$v]} $(delta "${apc[$v]}" "${apc[$b]}" %+.2f) ${bpc[$v]}"
    if [[ "$r" != - && -n "${ipc[$r]:-}" ]]; then
        row+=" $r $(ratio "${ipc[$v]}" "${ipc[$r]}") $(delta "${apc[$v]}" "${apc[$r]}" %+.2f)"
    else
        row+=" - - -"
    fi
    rows+=("$row")
done

if $json; then
    printf '%s\n' "${rows[@]}" | jq -R -s --argjson calls "[$n1,$n2]" '
        [split("\n")[] | select(length > 0) | split(" ") | {
            variant: .[0], baseline: .[1],
            instructions_per_call: (.[2] | tonumber), ratio: (.[3] | tonumber),
            instructions_over_baseline: (.[4] | tonumber),
            allocations_per_call: (.[5] | tonumber), allocations_over_baseline: (.[6] | tonumber),
            bytes_per_call: (.[7] | tonumber),
            rival: (if .[8] == "-" then null else .[8] end),
            ratio_to_rival: (if .[9] == "-" then null else (.[9] | tonumber) end),
            allocations_over_rival: (if .[10] == "-" then null else (.[10] | tonumber) end),
            calls: $calls
        }]'
else
    echo "instructions and allocations per call (client and server), from $n1 and $n2 calls"
    printf '%s\n' "variant baseline instr/call ratio +instr allocs/call +allocs bytes/call rival ratio +allocs" \
        "${rows[@]}" | column -t
fi
