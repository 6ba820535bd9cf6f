package sink

import "github.com/gemrecon/gemrecon/internal/field"

// Validate checks the retry policy of spec §4 as a command gives it, every
// field set (the backends fill zero fields with the defaults).
func (o Options) Validate() error {
	switch {
	case o.MaxAttempts < 1:
		return field.Errorf("sink: ", "{MaxAttempts} %d: must be at least 1", o.MaxAttempts)
	case o.RetryBase <= 0 || o.RetryMax < o.RetryBase:
		return field.Errorf("sink: ", "{RetryBase} must be positive and not above {RetryMax}")
	}
	return nil
}
