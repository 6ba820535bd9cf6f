// Package sqlscript owns the script of the --sql effect (spec §4): reading
// the file, lexing it into statements, the rules a script must follow to run
// inside the transaction that marks its key done (no parameter but the
// named ones, nothing that ends the transaction or changes the session),
// and the parameters bound for one attempt. The dispatcher runs it
// (dispatch/sql.go); the sink executes it (sink.SQLCompleter).
package sqlscript

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/effect"
)

// ParamNames returns the names of the parameters a script may use
// (without the @), in the order of spec §4. Params binds all of them.
func ParamNames() []string {
	return []string{"key", "name", "state", "source", "token", "attempt", "operation",
		"batch_state", "confirmed", "results_file", "webhook", "rerun"}
}

// Script is the --sql effect's script (spec §4), checked: the sink runs it
// inside the very transaction that marks the key done (sink.SQLCompleter).
// It is not an effect.Effect: the dispatcher hands Text and Params to the
// sink instead of calling Run.
type Script struct {
	path       string
	script     string
	statements []string
	uses       []string
}

// Load reads and checks a script file at start-up. Errors name the file
// and say what is wrong: an unreadable or empty file, an unterminated
// literal or comment, a parameter other than @key, @name, @state, @source,
// @token, @attempt, @operation, @batch_state, @confirmed, @results_file,
// @webhook and @rerun (an @ inside a string literal, a quoted identifier or a
// comment is not a parameter), a positional or other-style
// parameter (?, ?1, :name, $1, $name), or a statement that would end the
// transaction (BEGIN, COMMIT, END, ROLLBACK, ABORT, SAVEPOINT, RELEASE,
// START TRANSACTION, PREPARE TRANSACTION), a statement that would change
// the session of the connection it runs on (PRAGMA, ATTACH, DETACH, VACUUM,
// SET other than SET LOCAL/CONSTRAINTS/TRANSACTION, RESET, DISCARD), or any
// ROLLBACK at all (SQLite's
// OR ROLLBACK and RAISE(ROLLBACK, …) would roll back the whole transaction,
// and on SQLite the other operations of its group commit with it).
func Load(path string) (*Script, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%s: not UTF-8 text", path)
	}
	// A byte order mark that an editor put first is not part of the
	// script: SQLite skips one, PostgreSQL takes it for part of the first
	// word and fails every attempt with a syntax error.
	q, err := Parse(strings.TrimPrefix(string(b), "\ufeff"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	q.path = path
	return q, nil
}

// Parse checks a script as Load does, without a file.
func Parse(script string) (*Script, error) {
	stmts, uses, err := lexSQL(script)
	if err != nil {
		return nil, err
	}
	if len(stmts) == 0 {
		return nil, errors.New("no SQL statements (the script is empty or only comments)")
	}
	return &Script{script: script, statements: stmts, uses: uses}, nil
}

// Path is the file the script was loaded from ("" for Parse).
func (q *Script) Path() string { return q.path }

// Text is the script as written; the sink runs it as a whole.
func (q *Script) Text() string { return q.script }

// Statements are the script's statements as Load split them (for
// messages and tests; the sink runs Script).
func (q *Script) Statements() []string { return append([]string(nil), q.statements...) }

// Uses lists the parameters the script uses, without the @, in the order of
// their first use.
func (q *Script) Uses() []string { return append([]string(nil), q.uses...) }

// Params returns the named parameters for one attempt: key, name, state,
// source (text), token and attempt (integers), operation: the operation's
// JSON text — the API's once the key is confirmed, else the webhook's — or
// NULL when none was recorded (cast it on PostgreSQL: @operation::jsonb; on
// SQLite use the JSON functions, json_extract(@operation, '$.name')),
// batch_state (text), confirmed (a boolean; 1 or 0 on SQLite), results_file
// (text, ” when none), webhook (the first webhook body's JSON text, or
// NULL) (spec §9.3) and rerun (a boolean: an operator's rerun, spec §7).
func (q *Script) Params(ev effect.Event) map[string]any {
	var op, hook any
	if len(ev.Operation) > 0 {
		op = string(ev.Operation)
	}
	if len(ev.Webhook) > 0 {
		hook = string(ev.Webhook)
	}
	return map[string]any{
		"key":          ev.Key,
		"name":         ev.Name,
		"state":        ev.State,
		"source":       ev.Source,
		"token":        ev.Token,
		"attempt":      int64(ev.Attempt),
		"operation":    op,
		"batch_state":  ev.BatchState,
		"confirmed":    ev.Confirmed,
		"results_file": ev.ResultsFile,
		"webhook":      hook,
		"rerun":        ev.Rerun,
	}
}

func knownParam(name string) bool {
	for _, p := range ParamNames() {
		if p == name {
			return true
		}
	}
	return false
}

func knownList() string {
	var b strings.Builder
	for i, p := range ParamNames() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("@" + p)
	}
	return b.String()
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

func isIdentChar(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' || c == '$' }

func isParamChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= '0' && c <= '9'
}

// dollarTag returns the length of a PostgreSQL dollar-quote opening at
// s[0] == '$' ("$$" or "$tag$"), or 0.
func dollarTag(s string) int {
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == '$' {
			return i + 1
		}
		if !(isIdentStart(c) || i > 1 && c >= '0' && c <= '9') {
			return 0
		}
	}
	return 0
}

// stmtState follows one statement's words: its first two (transaction
// control) and, in a CREATE statement, a BEGIN … END body (a SQLite trigger,
// a PostgreSQL BEGIN ATOMIC function) whose semicolons do not end it.
type stmtState struct {
	start     int
	first     int      // where the first word starts
	words     []string // the first two words, upper case
	create    bool
	inBody    bool
	bodyDone  bool
	caseDepth int
	nonEmpty  bool
}

func (st *stmtState) word(w string) {
	st.nonEmpty = true
	u := strings.ToUpper(w)
	if len(st.words) < 2 {
		st.words = append(st.words, u)
		if len(st.words) == 1 && u == "CREATE" {
			st.create = true
		}
	}
	if !st.create || st.bodyDone {
		return
	}
	switch u {
	case "BEGIN":
		st.inBody = true
	case "CASE":
		if st.inBody {
			st.caseDepth++
		}
	case "END":
		if st.inBody {
			if st.caseDepth > 0 {
				st.caseDepth--
			} else {
				st.bodyDone = true
			}
		}
	}
}

// endsHere reports whether a semicolon ends the statement.
func (st *stmtState) endsHere() bool { return !st.inBody || st.bodyDone }

// Why a statement is refused.
const (
	whyTx      = "the script runs inside gemrecon's transaction and must not control it"
	whySession = "the script runs on gemrecon's own connection, where a session setting would outlive the transaction (on PostgreSQL, SET LOCAL is fine)"
)

// forbidden names a statement that would end or split the transaction, or
// change the session of the connection it runs on, and says why.
func (st *stmtState) forbidden() (what, why string) {
	if len(st.words) == 0 {
		return "", ""
	}
	second := ""
	if len(st.words) > 1 {
		second = st.words[1]
	}
	switch st.words[0] {
	case "BEGIN", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE":
		return st.words[0], whyTx
	case "START", "PREPARE":
		if second == "TRANSACTION" {
			return st.words[0] + " TRANSACTION", whyTx
		}
	case "PRAGMA", "ATTACH", "DETACH", "VACUUM", "RESET", "DISCARD":
		return st.words[0], whySession
	case "SET":
		switch second {
		case "LOCAL", "CONSTRAINTS", "TRANSACTION":
		default:
			return "SET", whySession
		}
	}
	return "", ""
}

// lexSQL splits script into statements and collects the parameters it uses.
// It knows the lexical rules the two backends share: '…' strings (a doubled quote inside),
// E'…' strings (backslash escapes), "…" and `…` identifiers, -- and /* */
// comments (nested, as PostgreSQL and pgx read them), and PostgreSQL
// $tag$…$tag$ strings.
func lexSQL(s string) (stmts, uses []string, err error) {
	lineOf := func(i int) int { return 1 + strings.Count(s[:i], "\n") }
	seen := map[string]bool{}
	st := &stmtState{}
	finish := func(end int) error {
		if st.nonEmpty {
			if what, why := st.forbidden(); what != "" {
				return fmt.Errorf("line %d: %s: %s", lineOf(st.first), what, why)
			}
			stmts = append(stmts, strings.TrimSpace(s[st.start:end]))
		}
		st = &stmtState{start: end + 1}
		return nil
	}
	i := 0
	for i < len(s) {
		c := s[i]
		switch {
		case c == '\'':
			j, err := skipQuoted(s, i, '\'', false)
			if err != nil {
				return nil, nil, err
			}
			st.nonEmpty, i = true, j
		case (c == 'e' || c == 'E') && i+1 < len(s) && s[i+1] == '\'':
			j, err := skipQuoted(s, i+1, '\'', true)
			if err != nil {
				return nil, nil, err
			}
			st.nonEmpty, i = true, j
		case c == '"' || c == '`':
			j, err := skipQuoted(s, i, c, false)
			if err != nil {
				return nil, nil, err
			}
			st.nonEmpty, i = true, j
		case c == '-' && strings.HasPrefix(s[i:], "--"):
			j := strings.IndexByte(s[i:], '\n')
			if j < 0 {
				i = len(s)
			} else {
				i += j + 1
			}
		case c == '/' && strings.HasPrefix(s[i:], "/*"):
			depth, j := 1, i+2
			for depth > 0 {
				if j >= len(s) {
					return nil, nil, fmt.Errorf("line %d: unterminated /* comment", lineOf(i))
				}
				switch {
				case strings.HasPrefix(s[j:], "/*"):
					depth, j = depth+1, j+2
				case strings.HasPrefix(s[j:], "*/"):
					depth, j = depth-1, j+2
				default:
					j++
				}
			}
			i = j
		case c == '$':
			if n := dollarTag(s[i:]); n > 0 {
				tag := s[i : i+n]
				k := strings.Index(s[i+n:], tag)
				if k < 0 {
					return nil, nil, fmt.Errorf("line %d: unterminated %s string", lineOf(i), tag)
				}
				st.nonEmpty, i = true, i+n+k+n
				continue
			}
			j := i + 1
			for j < len(s) && isParamChar(s[j]) {
				j++
			}
			if j > i+1 {
				return nil, nil, fmt.Errorf("line %d: parameter %s: use the named parameters %s", lineOf(i), s[i:j], knownList())
			}
			st.nonEmpty, i = true, i+1
		case c == '?':
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			return nil, nil, fmt.Errorf("line %d: positional parameter %s: use the named parameters %s (on PostgreSQL, write the jsonb operators ?, ?| and ?& as jsonb_exists, jsonb_exists_any and jsonb_exists_all)", lineOf(i), s[i:j], knownList())
		case c == ':' && i+1 < len(s) && isIdentStart(s[i+1]) && s[i+1] < 0x80 && (i == 0 || s[i-1] != ':'):
			j := i + 1
			for j < len(s) && isParamChar(s[j]) {
				j++
			}
			return nil, nil, fmt.Errorf("line %d: parameter %s: use the named parameters %s", lineOf(i), s[i:j], knownList())
		case c == '@' && i+1 < len(s) && (s[i+1] == '_' || s[i+1] < 0x80 && isIdentStart(s[i+1])):
			j := i + 1
			for j < len(s) && isParamChar(s[j]) {
				j++
			}
			name := s[i+1 : j]
			if !knownParam(name) {
				return nil, nil, fmt.Errorf("unknown parameter @%s at line %d (known: %s)", name, lineOf(i), knownList())
			}
			if !seen[name] {
				seen[name] = true
				uses = append(uses, name)
			}
			st.nonEmpty, i = true, j
		case isIdentStart(c):
			j := i + 1
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			if len(st.words) == 0 {
				st.first = i
			} else if strings.EqualFold(s[i:j], "ROLLBACK") {
				return nil, nil, fmt.Errorf("line %d: ROLLBACK (a conflict clause OR ROLLBACK, RAISE(ROLLBACK, …)): it would roll back gemrecon's whole transaction", lineOf(i))
			}
			st.word(s[i:j])
			i = j
		case c == ';':
			if st.endsHere() {
				if err := finish(i); err != nil {
					return nil, nil, err
				}
			}
			i++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		default:
			st.nonEmpty = true
			i++
		}
	}
	if st.inBody && !st.bodyDone {
		return nil, nil, fmt.Errorf("line %d: BEGIN without its END", lineOf(st.start))
	}
	if err := finish(len(s)); err != nil {
		return nil, nil, err
	}
	return stmts, uses, nil
}

// skipQuoted returns the index just past the literal or quoted identifier
// that opens at s[i] == q; a doubled q stands for itself, and with
// backslash a backslash escapes the next byte.
func skipQuoted(s string, i int, q byte, backslash bool) (int, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			if backslash {
				j++
			}
		case q:
			if j+1 < len(s) && s[j+1] == q {
				j++
				continue
			}
			return j + 1, nil
		}
	}
	what := "string literal"
	if q != '\'' {
		what = "quoted identifier"
	}
	return 0, fmt.Errorf("line %d: unterminated %s", 1+strings.Count(s[:i], "\n"), what)
}
