package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestDemoHonoursLogFlags: demo logs in --log-format and at --log-level like
// every command (spec §8) — a real process, so that a log line written to
// the process's own stderr by a default logger would show too. Under json
// every line on stderr is one JSON object; --log-level debug brings the
// wiring's debug records; without --log-level the demo stays quiet (warnings
// and errors only), so that logs do not drown its story.
func TestDemoHonoursLogFlags(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("runs the demo twice")
	}
	demo := func(args ...string) (levels map[string]int) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := child(t, append([]string{"--log-format", "json"}, args...)...)
		cmd.Env = append(cmd.Env, "GEMRECON_LOG_LEVEL=")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("gemrecon %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(cmd.Args[1:], " "), err, stdout.String(), stderr.String())
		}
		if !strings.Contains(stdout.String(), "each completion ran its effect once") {
			t.Errorf("demo's story is not on stdout:\n%s", stdout.String())
		}
		levels = map[string]int{}
		for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Errorf("stderr line is not JSON: %q", line)
				continue
			}
			levels[fmt.Sprint(m["level"])]++
		}
		return levels
	}
	if got := demo("--log-level", "debug", "demo"); got["DEBUG"] == 0 {
		t.Errorf("demo --log-level debug logged no debug records (records by level: %v)", got)
	}
	if got := demo("demo"); got["DEBUG"]+got["INFO"] > 0 {
		t.Errorf("demo without --log-level logged below warnings: %v", got)
	}
}
