package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/internal/demo"
	"github.com/gemrecon/gemrecon/internal/emulator"
	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// emulatorFlags are the flags of `gemrecon emulator` (spec §11).
type emulatorFlags struct {
	cfg         emulator.Config // the flags that are its fields
	batchesFile string
}

func (a *app) emulatorCommand() *cobra.Command {
	var f emulatorFlags
	cmd := &cobra.Command{
		Use:   "emulator",
		Short: "Run a local Gemini API stand-in to point poll, serve and webhooks at (no credentials)",
		Long:  emulatorLong,
		Example: `  gemrecon emulator --batches 6                # then, in another shell, paste the exports
  gemrecon emulator --batches-file testdata/gemini/batches-mixed.json --finish-within 30s
  gemrecon emulator --batches 20 --dynamic-webhook http://127.0.0.1:8080/webhook --drop 0.2 --duplicate 0.2
  gemrecon emulator --listen 127.0.0.1:0 --fail-rate 0.2 --seed 42 --log-format json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.config(cmd.Flags().Changed("api-key"))
			if err != nil {
				return err
			}
			return a.runEmulator(cmd.Context(), cfg)
		},
	}
	fs, c := cmd.Flags(), &f.cfg
	fs.StringVar(&c.Listen, "listen", emulator.DefaultListen, "address to listen on (port 0: any free port)")
	fs.StringVar(&c.APIKey, "api-key", "", "the one API key the emulator accepts (default: generated and printed)")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of every random choice: generated batches, drops, duplicates, faults (0: a random one, logged)")
	fs.IntVar(&c.Generate, "batches", 0, "generate this many batches that finish within --finish-within")
	fs.StringVar(&f.batchesFile, "batches-file", "", "add the batches of this JSON file (a list, as in testdata/gemini/)")
	fs.DurationVar(&c.FinishWithin, "finish-within", emulator.DefaultFinishWithin, "file and generated batches finish at random moments within this time (0: file batches are served as given, generated ones start finished)")
	fs.DurationVar(&c.CreatedFinishAfter, "created-finish-after", emulator.DefaultCreatedFinishAfter, "a batch made with Batches.Create succeeds after this time")
	fs.StringArrayVar(&c.DynamicURIs, "dynamic-webhook", nil, "give generated batches a webhookConfig with this URI (repeatable): their completions go there, dynamically signed")
	fs.Float64Var(&c.DynamicShare, "dynamic-share", 1, "the share of generated batches that get --dynamic-webhook (the others go to the static webhooks)")
	fs.StringVar((*string)(&c.Signature), "dynamic-signature", string(emulator.SignBoth), "how dynamic deliveries are signed: v1a, jwt or both")
	fs.Float64Var(&c.Drop, "drop", 0, "probability that a delivery is lost (never sent)")
	fs.Float64Var(&c.Duplicate, "duplicate", 0, "probability that a delivered message is sent once more")
	fs.Float64Var(&c.FailRate, "fail-rate", 0, "probability that an API request gets a 429 (with RetryInfo) or a 5xx instead of its answer")
	return cmd
}

// config checks the flags (exit 2 for a wrong one) and builds the
// emulator's Config.
func (f *emulatorFlags) config(apiKeyGiven bool) (emulator.Config, error) {
	cfg := f.cfg
	if cfg.DynamicShare == 0 && len(cfg.DynamicURIs) > 0 {
		return emulator.Config{}, usageError("--dynamic-share 0 gives --dynamic-webhook to no batch: leave --dynamic-webhook out instead")
	}
	if cfg.Listen == "" {
		return emulator.Config{}, usageError("--listen is empty: give host:port, e.g. %s", emulator.DefaultListen)
	}
	if cfg.APIKey == "" && apiKeyGiven {
		return emulator.Config{}, usageError("--api-key is empty: leave it out to have one generated")
	}
	if cfg.CreatedFinishAfter == 0 {
		cfg.CreatedFinishAfter = time.Nanosecond // "0" means at once, not the library's default
	}
	if f.batchesFile != "" {
		bs, err := geminifake.LoadBatches(f.batchesFile)
		if err != nil {
			return emulator.Config{}, usageError("--batches-file: %v", err)
		}
		cfg.Batches = bs
	}
	// The flags of emulator.Config's fields.
	return cfg, usage(cfg.Validate(), map[string]string{
		"Drop": "--drop", "Duplicate": "--duplicate", "FailRate": "--fail-rate", "DynamicShare": "--dynamic-share",
		"Generate": "--batches", "FinishWithin": "--finish-within", "CreatedFinishAfter": "--created-finish-after",
		"Signature": "--dynamic-signature", "DynamicURIs": "--dynamic-webhook",
	})
}

// runEmulator is `gemrecon emulator`: start, print the exports, log every
// event until ctx ends, stop.
func (a *app) runEmulator(ctx context.Context, cfg emulator.Config) error {
	log := a.logger
	cfg.OnEvent = func(ev emulator.Event) {
		log.LogAttrs(context.Background(), ev.Level(), string(ev.Kind), ev.Attrs()...)
	}
	e, err := emulator.New(cfg)
	if err != nil {
		return withCode(exitUsage, err)
	}
	if err := e.Start(); err != nil {
		return withCode(exitFatal, err)
	}
	defer e.Close()
	out := a.stdout
	fmt.Fprintf(out, "# gemrecon emulator: a Gemini API stand-in on %s (seed %d). In another shell:\n", e.URL(), e.Seed())
	fmt.Fprint(out, e.Exports())
	if os.Getenv("GOOGLE_API_KEY") != "" {
		fmt.Fprintln(out, "unset GOOGLE_API_KEY  # it wins over GEMINI_API_KEY, in gemrecon and in the SDK")
	}
	fmt.Fprintf(out, "# (the genai SDK reads GOOGLE_GEMINI_BASE_URL; or pass --base-url %s to poll and webhooks)\n", e.URL())
	fmt.Fprintf(out, "# Stop with Ctrl-C.\n")
	<-ctx.Done()
	if err := e.Close(); err != nil {
		log.Warn("emulator: closing the listener", "error", err)
	}
	st := e.Stats()
	d := st.Deliveries
	log.Info("emulator stopped", slog.Int("batches", st.Batches), slog.Int("created", st.Created), slog.Int("finished", st.Finished),
		slog.Int("faults", st.Faults), slog.Int("messages", d.Messages), slog.Int("attempts", d.Attempts),
		slog.Int("delivered", d.Delivered), slog.Int("failed", d.Failed), slog.Int("redelivered", d.Redelivered),
		slog.Int("dropped", d.Dropped), slog.Int("duplicates", d.Duplicates), slog.Int("exhausted", d.Exhausted),
		slog.Int("abandoned", d.Abandoned))
	return nil
}

const emulatorLong = `Serve a local stand-in for the Gemini batch API on --listen until SIGINT or
SIGTERM, and print what to export in another shell. It needs no credentials
and reaches no network. Batches come from --batches-file, --batches N
(generated) or the SDK's Batches.Create, and finish within --finish-within
(--created-finish-after). Its WebhookService sends each completion to the
registered webhooks (HMAC) or, for a batch with a webhookConfig
(--dynamic-webhook), to those URIs signed with the keys at
/.well-known/jwks.json. Deliveries are at least once; --drop, --duplicate and
--fail-rate inject faults, every random choice following --seed. One log line
per event goes to stderr; GET /emulator/status answers with the counts and
whether everything scheduled has ended ("idle").`

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
