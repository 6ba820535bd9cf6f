#!/usr/bin/env bash
# Disk syncs per completion on the product path (issue 23 item 3), counted
# with strace on the real binary and a SQLite database:
#   - serve --confirm never --forward URL, 100 deliveries sent 20 ms apart;
#   - poll --exec true finding 200 new completions (the emulator's).
# Each figure has the syncs of a start and a stop with no work subtracted.
# Needs strace, curl and python3 (a forward target that answers 204).
#
#   scripts/count-syncs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
go build -o "$work/gemrecon" ./cmd/gemrecon
g=$work/gemrecon
syncs() { grep -cE '^[0-9]+ +(fsync|fdatasync)\(' "$1" || true; }
init() { if "$g" init --help >/dev/null 2>&1; then "$g" --db "$1" init >/dev/null; fi; }

# The forward target: answers 204 to every POST.
python3 -c '
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()' 18291 &
pids+=($!)

# serve: a run with no work, then one with 100 deliveries 20 ms apart.
serve_run() { # DB TRACE N
	init "$1"
	strace -f -qq -e trace=fsync,fdatasync -o "$2" "$g" --db "$1" --log-level error serve --listen 127.0.0.1:18292 \
		--insecure-no-verify --confirm never --forward http://127.0.0.1:18291/ &
	local p=$!
	for _ in $(seq 100); do curl -sf http://127.0.0.1:18292/healthz >/dev/null && break; sleep 0.1; done
	for i in $(seq "$3"); do
		curl -sf -o /dev/null -X POST -H 'content-type: application/json' \
			--data "{\"type\":\"batch.succeeded\",\"data\":{\"id\":\"s$i\"}}" http://127.0.0.1:18292/webhook
		sleep 0.02
	done
	for _ in $(seq 100); do
		[ "$("$g" --db "$1" list --state done --limit 0 | tail -n +2 | wc -l)" -ge "$3" ] && break
		sleep 0.1
	done
	pkill -TERM -P "$p" # serve, not strace (which would only detach)
	wait "$p" || true
}
serve_run "$work/idle.db" "$work/serve-idle.trace" 0
serve_run "$work/serve.db" "$work/serve.trace" 100
idle=$(syncs "$work/serve-idle.trace")
busy=$(syncs "$work/serve.trace")
echo "serve: $busy syncs with 100 deliveries, $idle with none: $(python3 -c "print(round(($busy - $idle) / 100, 2))") per completion"

# poll: the emulator's 200 finished batches, and a pass over no batch.
emulator() { # N → prints the base URL
	"$g" emulator --listen 127.0.0.1:0 --api-key emu-syncs --batches "$1" --finish-within 0 --seed 3 \
		>"$work/emu$1.out" 2>/dev/null &
	pids+=($!)
	for _ in $(seq 100); do grep -q GOOGLE_GEMINI_BASE_URL "$work/emu$1.out" && break; sleep 0.1; done
	sed -n 's/^export GOOGLE_GEMINI_BASE_URL=//p' "$work/emu$1.out"
}
poll_run() { # DB TRACE BASE
	init "$1"
	GEMINI_API_KEY=emu-syncs strace -f -qq -e trace=fsync,fdatasync -o "$2" "$g" --db "$1" --log-level error poll \
		--base-url "$3" --qps 0 --exec true >/dev/null 2>&1 || true
}
poll_run "$work/pidle.db" "$work/poll-idle.trace" "$(emulator 0)"
poll_run "$work/poll.db" "$work/poll.trace" "$(emulator 200)"
idle=$(syncs "$work/poll-idle.trace")
busy=$(syncs "$work/poll.trace")
done=$("$g" --db "$work/poll.db" list --state done --limit 0 | tail -n +2 | wc -l)
echo "poll: $busy syncs for $done new completions, $idle for none: $(python3 -c "print(round(($busy - $idle) / $done, 2))") per completion"
