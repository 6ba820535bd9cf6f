package sqlite

import "github.com/gemrecon/gemrecon/sink"

// Hooks for the external tests of this package.

// SetBusyRetryHook makes f run before every pause of a retried busy
// operation; the returned function restores the previous hook.
func SetBusyRetryHook(f func(error)) (restore func()) {
	prev := testHookBusyRetry
	testHookBusyRetry = f
	return func() { testHookBusyRetry = prev }
}

// WithExtraMigration makes Open know one more migration after the embedded
// ones, as a newer gemrecon would: text must start with "-- min_reader: N".
// Use one call per version, in order.
func WithExtraMigration(name, text string) Option {
	return func(c *config) {
		m, err := sink.ParseMigration(name, text)
		if err != nil {
			panic(err)
		}
		if c.migrations == nil {
			c.migrations, _ = migrations()
		}
		c.migrations = append(c.migrations, m)
	}
}

// ParseMigration checks a migration file's name and first line.
func ParseMigration(name, text string) error {
	_, err := sink.ParseMigration(name, text)
	return err
}
