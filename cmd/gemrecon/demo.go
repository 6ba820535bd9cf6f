package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/internal/demo"
)

func (a *app) demoCommand() *cobra.Command {
	var keep string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "A self-contained run on loopback: each completion seen up to three times, its effect run once",
		Long: `Start the emulator and serve's receiver on free loopback ports with a
temporary database; five batches finish over about a second and a half. Their
completions arrive by signed webhook (static HMAC and per-job dynamic), each
delivered twice except one that is "lost"; then a poll pass sees them all
again. Keys first seen by webhook are confirmed with the API, and a succeeded
batch's results are written first. Ends with a table — one effect per
completion — and what one effect received. Needs no credentials and reaches
no network.

The story goes to stdout; logs go to stderr, warnings and errors only unless
--log-level (or GEMRECON_LOG_LEVEL) is given.`,
		Example: `  gemrecon demo
  gemrecon demo --keep /tmp/gemrecon-demo && gemrecon --db /tmp/gemrecon-demo/gemrecon.db status batches/demo-nightly`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The wiring's info lines would drown the story: unless
			// --log-level (or GEMRECON_LOG_LEVEL) says otherwise, the demo
			// logs warnings and errors only.
			log := a.logger
			if f := cmd.Flags().Lookup("log-level"); (f == nil || !f.Changed) && os.Getenv("GEMRECON_LOG_LEVEL") == "" {
				log = a.newLogger(slog.LevelWarn)
			}
			return demo.Run(cmd.Context(), demo.Config{Stdout: a.stdout, Stderr: a.stderr, Keep: keep,
				Logger: log, EffectOutput: a.execOutput()})
		},
	}
	cmd.Flags().StringVar(&keep, "keep", "", "keep the database, the effect log and the results directory in this directory (created if missing)")
	return cmd
}
