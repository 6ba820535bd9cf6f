package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// The command lines of the documentation (issue 26): every gemrecon command
// line in README.md, CHANGELOG.md, docs/ and deploy/ — in the Markdown's
// code blocks and inline code, systemd's ExecStart= lines and the args of
// Kubernetes containers — must parse with this binary's commands and flags,
// so that a renamed or removed flag fails here rather than in a user's
// crontab. Placeholders stand for values (…, KEY, D, DIR, URL: an upper-case
// word, or one holding "…"). A full command line (a code block, a unit, a
// manifest) of poll, serve or drain must also choose its effect (issue 24).
// A line meant to fail says so where a reader sees it: a "# fails" comment
// on it (in a code block or a unit).

// failMarker marks a documented command line that is meant to fail.
const failMarker = "# fails"

// docLine is one gemrecon command line found in a file.
type docLine struct {
	where string   // file:line
	args  []string // after the gemrecon word
	full  bool     // a whole command line, not a mention in prose
	fails bool     // marked failMarker
}

func TestDocumentedCommandLinesParse(t *testing.T) {
	lines := documentedLines(t, filepath.Join("..", ".."))
	if len(lines) < 50 {
		t.Fatalf("found only %d documented command lines: is the extraction broken?", len(lines))
	}
	perFile, onLine := map[string]int{}, map[string][]string{}
	for _, l := range lines {
		perFile[strings.SplitN(l.where, ":", 2)[0]]++
		if c := commandOf(l.args); l.full && c != "" {
			onLine[l.where] = append(onLine[l.where], c)
		}
		err := checkCommandLine(l.args, l.full)
		switch {
		case l.fails && err == nil:
			t.Errorf("%s: gemrecon %s: marked %q, but it parses and chooses an effect", l.where, strings.Join(l.args, " "), failMarker)
		case !l.fails && err != nil:
			t.Errorf("%s: gemrecon %s: %v", l.where, strings.Join(l.args, " "), err)
		}
	}
	// init runs once, as a step of its own: a line that runs it before a
	// command that writes would create a mistyped database again.
	for where, cmds := range onLine {
		c := " " + strings.Join(cmds, " ") + " "
		if strings.Contains(c, " init ") && (strings.Contains(c, " poll ") || strings.Contains(c, " serve ") || strings.Contains(c, " drain ")) {
			t.Errorf("%s runs init together with %s: run init once, as an install step", where, strings.TrimSpace(c))
		}
	}
	for _, f := range []string{"README.md", "deploy/systemd/gemrecon-poll.service", "deploy/systemd/gemrecon-serve.service",
		"deploy/kubernetes/serve.yaml", "deploy/kubernetes/poll-cronjob.yaml", "deploy/kubernetes/init-job.yaml"} {
		if perFile[f] == 0 {
			t.Errorf("no gemrecon command line found in %s", f)
		}
	}
}

// The checker itself: what it must refuse, and accept.
func TestCheckCommandLine(t *testing.T) {
	for _, c := range []struct {
		line string
		full bool
		ok   bool
	}{
		{"poll --exec ./publish.sh --min-interval 10m", true, true},
		{"--db KEY poll --lookback D --forward URL", true, true},
		{"poll --no-such-flag", false, false},
		{"poll --interval", false, false},    // a flag without its value
		{"poll --lookback 3d", false, false}, // not a duration, nor a placeholder
		{"poll", false, true},                // a mention in prose
		{"poll", true, false},                // a command line that chooses no effect
		{"drain --exec true --print", true, false},
		{"nosuchcommand", false, false},
		{"webhooks rotate ID --now", false, true},
	} {
		err := checkCommandLine(strings.Fields(c.line), c.full)
		if (err == nil) != c.ok {
			t.Errorf("checkCommandLine(%q, full=%v) = %v, want ok=%v", c.line, c.full, err, c.ok)
		}
	}
}

// placeholder reports whether a value stands for one: an upper-case word
// (KEY, D, DIR, URL, FILE) or one holding "…".
var placeholder = regexp.MustCompile(`^([A-Z][A-Z0-9_]*|.*….*)$`)

// checkCommandLine parses args (what follows the gemrecon word) as the
// command tree would: the command, then its flags. For a full line of a
// command that runs effects it also checks that exactly one effect is
// chosen.
func checkCommandLine(args []string, full bool) error {
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	root.InitDefaultCompletionCmd()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	if cmd == root && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		return fmt.Errorf("unknown command %q", rest[0])
	}
	rest = withPlaceholderValues(cmd, rest)
	if err := cmd.ParseFlags(rest); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if err := cmd.ValidateFlagGroups(); err != nil {
		return err
	}
	synopsis := strings.Contains(strings.Join(args, " "), "[") // "poll [flags]", "retry KEY… | --all-dead"
	if full && !synopsis && (cmd.Name() == "poll" || cmd.Name() == "serve" || cmd.Name() == "drain") {
		n := 0
		for _, e := range effectNames {
			if cmd.Flags().Changed(e) {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("chooses %d effects, want 1 of --%s", n, strings.Join(effectNames, ", --"))
		}
	}
	return nil
}

// withPlaceholderValues replaces a placeholder given to a flag that is not a
// string (a duration, a number) with the flag's default, so that it parses.
func withPlaceholderValues(cmd *cobra.Command, args []string) []string {
	fs := cmd.Flags()
	fs.AddFlagSet(cmd.InheritedFlags())
	typed := func(name string) *pflag.Flag {
		f := fs.Lookup(name)
		if f == nil || f.Value.Type() == "string" || f.Value.Type() == "bool" {
			return nil
		}
		return f
	}
	out := append([]string(nil), args...)
	for i, arg := range out {
		name, value, eq := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !strings.HasPrefix(arg, "--") {
			continue
		}
		f := typed(name)
		switch {
		case f == nil:
		case eq && placeholder.MatchString(value):
			out[i] = "--" + name + "=" + f.DefValue
		case !eq && i+1 < len(out) && placeholder.MatchString(out[i+1]):
			out[i+1] = f.DefValue
		}
	}
	return out
}

// documentedLines finds the gemrecon command lines of the documentation
// under root.
func documentedLines(t *testing.T, root string) []docLine {
	t.Helper()
	var files []string
	for _, f := range []string{"README.md", "CHANGELOG.md"} {
		files = append(files, filepath.Join(root, f))
	}
	for _, dir := range []string{"docs", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var out []docLine
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		switch filepath.Ext(f) {
		case ".md":
			out = append(out, markdownLines(rel, string(b))...)
		case ".service", ".timer":
			out = append(out, unitLines(rel, string(b))...)
		case ".yaml", ".yml":
			out = append(out, manifestLines(t, rel, b)...)
		}
	}
	return out
}

// markdownLines: every line of a fenced code block (continued lines
// joined), and every inline code span of the prose, that runs gemrecon.
func markdownLines(file, text string) []docLine {
	var out []docLine
	inBlock, cont := false, ""
	contAt := 0
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			for _, span := range inlineCode.FindAllStringSubmatch(line, -1) {
				for _, args := range gemreconCalls(span[1]) {
					out = append(out, docLine{where: fmt.Sprintf("%s:%d", file, n), args: args})
				}
			}
			continue
		}
		if cont == "" {
			contAt = n
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cont += s + " "
			continue
		}
		line, cont = cont+line, ""
		for _, args := range gemreconCalls(line) {
			out = append(out, docLine{where: fmt.Sprintf("%s:%d", file, contAt), args: args, full: true,
				fails: strings.Contains(line, failMarker)})
		}
	}
	return out
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// unitLines: the ExecStart= lines of a systemd unit (comment lines above a
// line may mark it failMarker only on the line itself).
func unitLines(file, text string) []docLine {
	var out []docLine
	for i, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			for _, args := range gemreconCalls(v) {
				out = append(out, docLine{where: fmt.Sprintf("%s:%d", file, i+1), args: args, full: true,
					fails: strings.Contains(line, failMarker)})
			}
		}
	}
	return out
}

// manifestLines: the args of every container of a Kubernetes manifest whose
// image is gemrecon's (its entrypoint is gemrecon).
func manifestLines(t *testing.T, file string, b []byte) []docLine {
	t.Helper()
	var out []docLine
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("%s: %v", file, err)
			}
			return out
		}
		walkYAML(&doc, func(n *yaml.Node) {
			image, args := mapValue(n, "image"), mapValue(n, "args")
			if image == nil || args == nil || !strings.Contains(image.Value, "gemrecon") {
				return
			}
			var as []string
			if err := args.Decode(&as); err != nil {
				t.Fatalf("%s:%d: args: %v", file, args.Line, err)
			}
			out = append(out, docLine{where: fmt.Sprintf("%s:%d", file, args.Line), args: as, full: true,
				fails: strings.Contains(args.LineComment+args.HeadComment, failMarker)})
		})
	}
}

func walkYAML(n *yaml.Node, fn func(*yaml.Node)) {
	if n.Kind == yaml.MappingNode {
		fn(n)
	}
	for _, c := range n.Content {
		walkYAML(c, fn)
	}
}

// mapValue is the value of key in the mapping node n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// gemreconCalls returns the arguments of every gemrecon command in a shell
// line: a word whose last path element is gemrecon (or "go run
// ./cmd/gemrecon") in command position, up to the end of its simple
// command (an unquoted |, ;, &, >, <, ), # or backtick).
func gemreconCalls(line string) [][]string {
	words := shellWords(line)
	var out [][]string
	cmdPos := true
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w.op {
			cmdPos = true
			continue
		}
		if !cmdPos {
			continue
		}
		if strings.Contains(w.text, "=") && !strings.HasPrefix(w.text, "-") && !w.quoted {
			continue // VAR=value before the command
		}
		cmdPos = false
		start := -1
		switch {
		case filepath.Base(w.text) == "gemrecon" && !w.quoted:
			start = i + 1
		case w.text == "go" && i+2 < len(words) && words[i+1].text == "run" && words[i+2].text == "./cmd/gemrecon":
			start = i + 3
		case w.text == "exec" || w.text == "sudo" || w.text == "time" || w.text == "until" || w.text == "if" || w.text == "!":
			cmdPos = true
		}
		if start < 0 {
			continue
		}
		var args []string
		j := start
		for ; j < len(words) && !words[j].op; j++ {
			args = append(args, words[j].text)
		}
		out = append(out, args)
		i = j - 1
	}
	return out
}

// word is a shell word, or an operator that ends a simple command.
type word struct {
	text   string
	op     bool
	quoted bool
}

// shellWords splits a line as /bin/sh would, far enough for documentation:
// quotes, backslashes, operators, comments, $(…) and backticks (their
// insides are a command of their own).
func shellWords(line string) []word {
	var out []word
	var cur strings.Builder
	inWord, quoted := false, false
	flush := func() {
		if inWord {
			out = append(out, word{text: cur.String(), quoted: quoted})
		}
		cur.Reset()
		inWord, quoted = false, false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				j = len(line) - i - 1
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord, quoted = true, true
			i += j + 1
		case c == '"':
			j := i + 1
			for ; j < len(line) && line[j] != '"'; j++ {
				if line[j] == '\\' && j+1 < len(line) {
					j++
				}
				cur.WriteByte(line[j])
			}
			inWord, quoted = true, true
			i = j
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			inWord = true
			i++
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			flush()
			return append(out, word{op: true})
		case c == '$' && i+1 < len(line) && line[i+1] == '(':
			flush()
			out = append(out, word{op: true})
			i++
		case strings.IndexByte("|;&<>)`", c) >= 0:
			if c == '>' && inWord && isDigits(cur.String()) { // 2>
				cur.Reset()
				inWord = false
			}
			flush()
			out = append(out, word{op: true})
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return out
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// TestDocLinks: every relative link of README.md, CHANGELOG.md and docs/
// names a file that exists and, for a Markdown file, a heading (GitHub's
// anchor for it) or an <a id> that is there: what moved out of the README
// stays one click away.
func TestDocLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	files := []string{filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, more...)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a, seen := map[string]bool{}, map[string]int{}
		inBlock := false
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
			}
			if m := htmlID.FindAllStringSubmatch(line, -1); m != nil {
				for _, id := range m {
					a[id[1]] = true
				}
			}
			if inBlock || !strings.HasPrefix(line, "#") {
				continue
			}
			slug := githubSlug(strings.TrimLeft(line, "# "))
			if n := seen[slug]; n > 0 {
				a[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				a[slug] = true
			}
			seen[slug]++
		}
		anchors[path] = a
		return a
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %s: %v", rel, i+1, target, err)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link %s: no heading or id %q in %s", rel, i+1, target, anchor, filepath.Base(dest))
				}
			}
		}
	}
}

var (
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	htmlID = regexp.MustCompile(`<a id="([^"]+)"`)
)

// githubSlug is GitHub's anchor for a Markdown heading: lower case, every
// character but letters, digits, spaces, hyphens and underscores dropped,
// spaces made hyphens.
func githubSlug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
