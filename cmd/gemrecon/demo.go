package main

import (
	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/internal/demo"
)

func (a *app) demoCommand() *cobra.Command {
	var keep string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "A self-contained run on loopback: each completion seen up to three times, its effect run once",
		Long: `Start the emulator (the Gemini API stand-in of 'gemrecon emulator', with its
WebhookService and key set) and serve's webhook receiver on free loopback
ports with a temporary database; five batches finish over about a second and a
half (one fails, one expires). Their completions arrive by signed webhook —
four through a static webhook (HMAC), one through a per-job webhookConfig
(signed with the emulator's published keys) — each delivered twice, except one
that is "lost"; then a poll pass sees them all again. Every key first seen by
webhook is confirmed with the API (Batches.Get) before its effect runs, and a
succeeded batch's results are written to a results directory first. The
effect appends a line per run to a file. Ends with a table — one effect per
completion — and what one webhook-first key's effect received. Needs no
credentials and reaches no network.`,
		Example: `  gemrecon demo
  gemrecon demo --keep /tmp/gemrecon-demo && gemrecon --db /tmp/gemrecon-demo/gemrecon.db status batches/demo-nightly`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return demo.Run(cmd.Context(), demo.Config{Stdout: a.stdout, Stderr: a.stderr, Keep: keep})
		},
	}
	cmd.Flags().StringVar(&keep, "keep", "", "keep the database, the effect log and the results directory in this directory (created if missing)")
	return cmd
}
