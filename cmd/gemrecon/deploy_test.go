package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// The rules deploy/ must keep (issue 24 item 1, issue 26 item 2), read from
// the files themselves. (CI also runs systemd-analyze verify on the units,
// with this build installed where they name it: .ci/run.)

// unit is a systemd unit file: section → key → values (a key may repeat).
type unit map[string]map[string][]string

func readUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u, section := unit{}, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, _ := strings.Cut(line, "=")
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// execArgs is the gemrecon command of a unit's ExecStart=.
func (u unit) execArgs(t *testing.T) []string {
	t.Helper()
	calls := gemreconCalls(u.get("Service", "ExecStart"))
	if len(calls) != 1 {
		t.Fatalf("ExecStart= %q runs gemrecon %d times, want once", u.get("Service", "ExecStart"), len(calls))
	}
	return calls[0]
}

// commandOf is the gemrecon subcommand args run (the first word that is no
// flag or flag value).
func commandOf(args []string) string {
	a := &app{}
	c, _, err := a.rootCommand().Find(args)
	if err != nil {
		return ""
	}
	return c.Name()
}

// flagValue is the value of --name in args, or def.
func flagValue(args []string, name, def string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return def
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestSystemdUnits(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "systemd")
	units := map[string]unit{}
	for _, n := range []string{"gemrecon-init.service", "gemrecon-poll.service", "gemrecon-poll.timer", "gemrecon-serve.service"} {
		units[n] = readUnit(t, filepath.Join(dir, n))
	}
	for name, u := range units {
		if !strings.HasSuffix(name, ".service") {
			continue
		}
		args := u.execArgs(t)
		cmd := commandOf(args)
		if bin := strings.Fields(u.get("Service", "ExecStart"))[0]; bin != "/usr/local/bin/gemrecon" {
			t.Errorf("%s runs %s, want /usr/local/bin/gemrecon (where CI installs the build to verify the units)", name, bin)
		}
		if user := u.get("Service", "User"); user == "" || user == "root" {
			t.Errorf("%s: User=%q, want an unprivileged user", name, user)
		}
		for _, k := range []string{"StateDirectory", "NoNewPrivileges", "ProtectSystem", "PrivateTmp", "CapabilityBoundingSet"} {
			if len(u["Service"][k]) == 0 {
				t.Errorf("%s lacks %s=", name, k)
			}
		}
		if flagValue(args, "db", "") != "/var/lib/"+u.get("Service", "StateDirectory")+"/sink.db" {
			t.Errorf("%s: --db %q is not in its StateDirectory", name, flagValue(args, "db", ""))
		}
		// init runs once, as an install step that nothing pulls in: never
		// before every start (a mistyped --db would be created again).
		if cmd == "init" {
			if u.get("Service", "Type") != "oneshot" || len(u["Install"]) > 0 {
				t.Errorf("%s: init must be a oneshot unit with no [Install] section", name)
			}
			continue
		}
		for _, k := range []string{"Requires", "Wants", "After", "BindsTo", "Upholds"} {
			if strings.Contains(strings.Join(u["Unit"][k], " "), "gemrecon-init") {
				t.Errorf("%s pulls in or orders after gemrecon-init (%s=): init runs once, at install", name, k)
			}
		}
		if len(u["Service"]["ExecStartPre"]) > 0 {
			t.Errorf("%s has ExecStartPre=: init must not run before every start", name)
		}
		if !strings.Contains(strings.Join(u["Service"]["LoadCredential"], " "), "gemini-api-key:") ||
			!strings.Contains(strings.Join(u["Service"]["Environment"], " "), "GEMINI_API_KEY_FILE=%d/gemini-api-key") {
			t.Errorf("%s: the API key must come from a credentials file (LoadCredential=, GEMINI_API_KEY_FILE=%%d/…)", name)
		}
	}
	if c := commandOf(units["gemrecon-poll.service"].execArgs(t)); c != "poll" {
		t.Errorf("gemrecon-poll.service runs %q", c)
	}
	if units["gemrecon-poll.timer"].get("Timer", "OnCalendar") == "" {
		t.Error("gemrecon-poll.timer has no OnCalendar=")
	}
	serve := units["gemrecon-serve.service"]
	args := serve.execArgs(t)
	if !strings.HasPrefix(flagValue(args, "secret-file", ""), "%d/") {
		t.Errorf("serve's --secret-file %q is not in its credentials directory (%%d)", flagValue(args, "secret-file", ""))
	}
	stop := mustDuration(t, strings.TrimSpace(serve.get("Service", "TimeoutStopSec"))+"s")
	if need := mustDuration(t, flagValue(args, "grace", "10s")) + mustDuration(t, flagValue(args, "drain-timeout", "30s")); stop <= need {
		t.Errorf("serve's TimeoutStopSec=%v must exceed --grace + --drain-timeout = %v", stop, need)
	}
}

// TestKubernetesManifests: init is a Job of its own; the CronJob polls, the
// Deployment serves with probes on /readyz and /healthz and a termination
// grace longer than serve's --grace + --drain-timeout; the credentials come
// from a Secret.
func TestKubernetesManifests(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "kubernetes")
	type container struct {
		Args []string `yaml:"args"`
		Env  []struct {
			Name      string `yaml:"name"`
			ValueFrom struct {
				SecretKeyRef struct {
					Name string `yaml:"name"`
				} `yaml:"secretKeyRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		ReadinessProbe struct {
			HTTPGet struct{ Path string } `yaml:"httpGet"`
		} `yaml:"readinessProbe"`
		LivenessProbe struct {
			HTTPGet struct{ Path string } `yaml:"httpGet"`
		} `yaml:"livenessProbe"`
	}
	type podSpec struct {
		TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
		Containers                    []container `yaml:"containers"`
	}
	type object struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Template struct {
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"`
			JobTemplate struct {
				Spec struct {
					Template struct {
						Spec podSpec `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			} `yaml:"jobTemplate"`
		} `yaml:"spec"`
	}
	byKind := map[string]podSpec{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for {
			var o object
			if err := dec.Decode(&o); err != nil {
				break
			}
			spec := o.Spec.Template.Spec
			if o.Kind == "CronJob" {
				spec = o.Spec.JobTemplate.Spec.Template.Spec
			}
			byKind[o.Kind] = spec
		}
		f.Close()
	}
	for kind, want := range map[string]string{"Job": "init", "CronJob": "poll", "Deployment": "serve"} {
		spec, ok := byKind[kind]
		if !ok || len(spec.Containers) != 1 {
			t.Errorf("no %s with one container", kind)
			continue
		}
		c := spec.Containers[0]
		if got := commandOf(c.Args); got != want {
			t.Errorf("the %s runs %q, want %q (init runs as a Job of its own, never before every start)", kind, got, want)
		}
		secrets := map[string]bool{}
		for _, e := range c.Env {
			if e.ValueFrom.SecretKeyRef.Name != "" {
				secrets[e.Name] = true
			}
		}
		needs := []string{"GEMRECON_DB"}
		switch want {
		case "poll":
			needs = append(needs, "GEMINI_API_KEY")
		case "serve":
			needs = append(needs, "GEMINI_API_KEY", "GEMRECON_WEBHOOK_SECRET")
		}
		for _, n := range needs {
			if !secrets[n] {
				t.Errorf("the %s's %s does not come from a Secret", kind, n)
			}
		}
	}
	serve := byKind["Deployment"]
	if len(serve.Containers) == 1 {
		c := serve.Containers[0]
		if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
			t.Errorf("serve's probes: readiness %q, liveness %q; want /readyz and /healthz", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
		}
		need := mustDuration(t, flagValue(c.Args, "grace", "10s")) + mustDuration(t, flagValue(c.Args, "drain-timeout", "30s"))
		if got := time.Duration(serve.TerminationGracePeriodSeconds) * time.Second; got <= need {
			t.Errorf("terminationGracePeriodSeconds %v must exceed serve's --grace + --drain-timeout = %v", got, need)
		}
	}
}

// A service that keeps the API key out of its environment gives its path
// in GEMINI_API_KEY_FILE (systemd's LoadCredential=): poll then lists with
// it. An empty or missing file is refused at start.
func TestAPIKeyFile(t *testing.T) {
	parallel(t)
	api := fakeAPI(t, "SUCCEEDED")
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	keyFile := filepath.Join(dir, "gemini-api-key")
	if err := os.WriteFile(keyFile, []byte(testAPIKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"GEMINI_API_KEY=", "GOOGLE_API_KEY=", "GEMINI_API_KEY_FILE=" + keyFile}
	if r := runChild(t, env, pollArgs(db, api, "--print")...); r.code != exitOK || !strings.Contains(r.stderr, "new=1") {
		t.Fatalf("poll with GEMINI_API_KEY_FILE: %v", r)
	}
	if err := os.WriteFile(keyFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runChild(t, env, pollArgs(db, api, "--print")...); r.code != exitUsage || !strings.Contains(r.stderr, "GEMINI_API_KEY_FILE: "+keyFile+" is empty") {
		t.Fatalf("poll with an empty GEMINI_API_KEY_FILE: want exit 2 saying so, got %v", r)
	}
}
