#!/usr/bin/env bash
# A rolling upgrade under kill -9 (issue 23): the gemrecon built from
# OLD_REV (default: the last commit before the sink's state machine moved
# into package sink) and the one of this checkout run `poll --watch` against
# one database at the same time, while an emulator's batches finish. Every
# second or so one of the two is killed with SIGKILL and started again as
# the other binary. Then this checkout's gemrecon runs until nothing is left
# to do, and the script checks that every batch the emulator finished is
# done in the database, with its effect run at least once; it prints the
# effects that ran twice (each one a kill inside the window of design §1).
#
#   scripts/rolling-upgrade.sh                 # SQLite, a file in a temporary directory
#   scripts/rolling-upgrade.sh 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
#
# Environment: OLD_REV, BATCHES (default 300), CHAOS_SECONDS (default 40).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD_REV=${OLD_REV:-18082bd}
BATCHES=${BATCHES:-300}
CHAOS_SECONDS=${CHAOS_SECONDS:-40}
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	git worktree remove --force "$work/old" 2>/dev/null || true
}
trap cleanup EXIT
[ -n "${KEEP:-}" ] && echo "$work" >"$KEEP"
say() { echo "rolling-upgrade: $*" >&2; }

say "building $OLD_REV and this checkout in $work"
git worktree add --detach "$work/old" "$OLD_REV" >/dev/null 2>&1
(cd "$work/old" && go build -o "$work/gemrecon-old" ./cmd/gemrecon)
go build -o "$work/gemrecon-new" ./cmd/gemrecon
old=$work/gemrecon-old new=$work/gemrecon-new

db=${1:-$work/rolling.db}
if [[ $db == postgres* ]]; then
	schema=rolling_$(date +%s)_$$
	sep='?'; [[ $db == *\?* ]] && sep='&'
	db="$db${sep}search_path=$schema"
fi
export GEMRECON_DB=$db

key=emu-rolling-upgrade
"$new" emulator --listen 127.0.0.1:0 --api-key "$key" --batches "$BATCHES" --finish-within "${CHAOS_SECONDS}s" \
	--seed 7 >"$work/emulator.out" 2>"$work/emulator.log" &
pids+=($!)
for _ in $(seq 100); do grep -q GOOGLE_GEMINI_BASE_URL "$work/emulator.out" && break; sleep 0.1; done
base=$(sed -n 's/^export GOOGLE_GEMINI_BASE_URL=//p' "$work/emulator.out")
[ -n "$base" ] || { cat "$work/emulator.log"; exit 1; }
export GEMINI_API_KEY=$key GOOGLE_GEMINI_BASE_URL=$base
say "emulator at $base, $BATCHES batches finishing within ${CHAOS_SECONDS}s; database $db"

# The new gemrecon creates the database on purpose (gemrecon init); the
# old one creates it on open.
if "$new" init --help >/dev/null 2>&1; then "$new" init >&2; fi
effect='echo "$GEMRECON_KEY $GEMRECON_TOKEN" >> '"$work/effects.log"
# The new gemrecon wants the effect chosen on purpose; --exec is.
run() { # binary, then poll's flags
	local bin=$1; shift
	"$bin" poll --exec "$effect" --lease 4s --effect-timeout 2s --log-level error "$@" >>"$work/$(basename "$bin").log" 2>&1 &
	echo $!
}

slot=(0 0) binary=("$old" "$new") kills=0
end=$((SECONDS + CHAOS_SECONDS))
while ((SECONDS < end)); do
	for i in 0 1; do
		if ((slot[i] == 0)) || ! kill -0 "${slot[i]}" 2>/dev/null; then
			slot[i]=$(run "${binary[i]}" --watch --interval 1s)
			pids+=("${slot[i]}")
		fi
	done
	sleep "0.$((RANDOM % 9 + 1))"
	i=$((RANDOM % 2))
	if kill -9 "${slot[i]}" 2>/dev/null; then
		kills=$((kills + 1))
		# the next start in this slot is the other binary
		if [[ ${binary[i]} == "$old" ]]; then binary[i]=$new; else binary[i]=$old; fi
	fi
	slot[i]=0
done
for i in 0 1; do ((slot[i] == 0)) || kill -9 "${slot[i]}" 2>/dev/null || true; done
say "$kills kills; letting this checkout's gemrecon finish"

# Claims of killed processes expire after --lease; poll until nothing is
# left to do and the emulator has finished every batch.
for _ in $(seq "${FINISH_TRIES:-90}"); do
	"$new" poll --exec "$effect" --lease 4s --effect-timeout 2s --log-level error --force >/dev/null 2>&1 || true
	states=$("$new" stats --json 2>/dev/null | tr -d ' \n' | grep -o '"by_state":{[^}]*}' || true)
	idle=$(curl -sf "$base/emulator/status" | grep -c '"idle":true' || true)
	[[ $states == *'"pending":0'* && $states == *'"claimed":0'* && $states == *"\"done\":$BATCHES"* && $idle == 1 ]] && break
	sleep 1
done

"$new" list --state done --limit 0 --json | tr -d ' ' | sed -n 's/^"key":"\(.*\)",$/\1/p' | sort -u >"$work/done.keys"
done_keys=$(wc -l <"$work/done.keys")
cut -d' ' -f1 "$work/effects.log" | sort -u >"$work/ran.keys"
ran=$(wc -l <"$work/ran.keys")
lines=$(wc -l <"$work/effects.log")
missing=$(comm -23 "$work/done.keys" "$work/ran.keys" | wc -l)
say "keys done: $done_keys of $BATCHES batches; $states; effects: $lines runs of $ran keys, $((lines - ran)) ran twice; done without an effect run: $missing"
if ((done_keys != BATCHES || missing > 0)) || [[ $states != *'"pending":0'* || $states != *'"claimed":0'* || $states != *'"dead":0'* ]]; then
	say "FAILED (files in $work)"
	exit 1
fi
say "ok: every key ended done once"
