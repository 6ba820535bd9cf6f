// Package field owns configuration errors that name the fields they are
// about. A library's Validate says what is wrong in its own words, naming
// its config fields ("effect timeout 10s must be shorter than the lease
// 5s"); the CLI, which knows which flag sets which field, renders the same
// error with the flag names ("--effect-timeout 10s must be shorter than
// --lease 5s") and turns it into exit 2. So no library error names a CLI
// flag, and every rule's message is written once, where the rule lives.
package field

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// Error is a configuration error about one or more fields. Its message is
// written with each field as {Field} (the Go field name) or {words|Field}
// (the library's own words for it); Error renders those as words (Words of
// the name when none are given), Render as whatever the caller names them.
type Error struct {
	prefix string // "dispatch: ", in Error only
	format string
	args   []any
}

// Errorf returns an *Error. In format, {Name} stands for the config field
// Name (a Go identifier: {EffectTimeout}) and {the lease|Lease} for the field
// Lease, spelt "the lease" by Error; the rest is as for fmt.Errorf, %w
// included.
func Errorf(prefix, format string, args ...any) *Error {
	return &Error{prefix: prefix, format: format, args: args}
}

// Error renders the fields as lower-case words ({EffectTimeout}: "effect
// timeout"), after the package prefix.
func (e *Error) Error() string {
	return e.prefix + e.Render(func(string) string { return "" })
}

// Render renders the message with each field named by name, without the
// package prefix. A name that returns "" leaves the field in words.
func (e *Error) Render(name func(field string) string) string {
	format := placeholder.ReplaceAllStringFunc(strings.ReplaceAll(e.format, "%w", "%v"), func(ph string) string {
		m := placeholder.FindStringSubmatch(ph)
		words := cmp.Or(name(m[2]), m[1], Words(m[2]))
		return strings.ReplaceAll(words, "%", "%%") // inserted text is no verb
	})
	return fmt.Sprintf(format, e.args...)
}

// placeholder matches {Field} or {words|Field} in a format.
var placeholder = regexp.MustCompile(`\{(?:([^{}|]*)\|)?(\w+)\}`)

// Unwrap returns the errors wrapped with %w.
func (e *Error) Unwrap() []error {
	var errs []error
	for _, a := range e.args {
		if err, ok := a.(error); ok {
			errs = append(errs, err)
		}
	}
	return errs
}

// Words spells a Go field name as lower-case words: EffectTimeout is
// "effect timeout", QPS "qps", PageSize "page size".
func Words(f string) string {
	var b strings.Builder
	r := []rune(f)
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var fe *Error
	ok := errors.As(err, &fe)
	return fe, ok
}
