package field_test

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/gemrecon/gemrecon/internal/field"
)

func TestError(t *testing.T) {
	err := field.Errorf("dispatch: ", "{EffectTimeout} %v must be shorter than {the lease|Lease} %v (100%% sure)", "10s", "5s")
	if got, want := err.Error(), "dispatch: effect timeout 10s must be shorter than the lease 5s (100% sure)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	flags := map[string]string{"EffectTimeout": "--effect-timeout"}
	got := err.Render(func(f string) string { return flags[f] })
	if want := "--effect-timeout 10s must be shorter than the lease 5s (100% sure)"; got != want {
		t.Errorf("Render = %q, want %q", got, want)
	}
}

func TestErrorWraps(t *testing.T) {
	var err error = field.Errorf("", "{Path}: %w", fs.ErrNotExist)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false, want true", err)
	}
	if got, want := err.Error(), "path: file does not exist"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if fe, ok := field.As(errors.Join(errors.New("x"), err)); !ok || fe == nil {
		t.Errorf("As(joined) = %v, %v; want the *Error", fe, ok)
	}
	if got, want := field.Errorf("", "unclosed {brace").Error(), "unclosed {brace"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestWords(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"EffectTimeout", "effect timeout"}, {"QPS", "qps"}, {"PageSize", "page size"},
		{"APIKey", "api key"}, {"Lease", "lease"}, {"FullScanEvery", "full scan every"},
	} {
		if got := field.Words(tt.in); got != tt.want {
			t.Errorf("Words(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := field.Words(field.Words(tt.in)); got != tt.want {
			t.Errorf("Words(Words(%q)) = %q, want %q (idempotent)", tt.in, got, tt.want)
		}
	}
}
