package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/genai"
	"google.golang.org/genai/interactions"
	"google.golang.org/genai/interactions/models/apierrors"
	"google.golang.org/genai/interactions/models/operations"
	"google.golang.org/genai/interactions/models/webhooks"
	"google.golang.org/genai/interactions/retry"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/webhook"
)

// webhooksFlags are the credential and endpoint flags of every webhooks
// subcommand: poll's rules (spec §10).
type webhooksFlags struct {
	backend string
	baseURL string
}

// defaultEvents is what `webhooks create` subscribes to without --events:
// every batch completion (batch.cancelled is in the JS SDK's and the
// guide's catalogue, not yet in the Go SDK's enum, which sends it as
// given).
const defaultEvents = "batch.succeeded,batch.failed,batch.expired,batch.cancelled"

func (a *app) webhooksCommand() *cobra.Command {
	var f webhooksFlags
	cmd := &cobra.Command{
		Use:   "webhooks",
		Short: "Set up the Gemini API's side: register, list, ping, rotate, enable and delete static webhooks",
		Long: `Manage the Gemini API's static webhooks (registered per project, fired for
every subscribed event) through the genai SDK's WebhookService. Credentials
as for poll (GOOGLE_API_KEY, else GEMINI_API_KEY; --base-url for an emulator
or proxy); --backend vertex is refused: Vertex AI has no push notifications
for batch prediction jobs. The service's errors are shown with their HTTP
status and message (exit 1); wrong words on the command line exit 2.`,
		Example: `  gemrecon webhooks create --url https://hooks.example.com/webhook --secret-file /etc/gemrecon/whsec
  gemrecon webhooks list`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError("unknown command %q for %q: see 'gemrecon webhooks --help'", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.backend, "backend", "gemini", "API backend: gemini only (API key from GOOGLE_API_KEY or GEMINI_API_KEY); vertex is refused")
	pf.StringVar(&f.baseURL, "base-url", "", "API base URL, to point at an emulator or proxy (default: the SDK's)")
	cmd.AddCommand(
		a.webhooksCreateCommand(&f),
		a.webhooksListCommand(&f),
		a.webhooksPingCommand(&f),
		a.webhooksRotateCommand(&f),
		a.webhooksEnableCommand(&f),
		a.webhooksDeleteCommand(&f),
	)
	return cmd
}

// contained turns a panic of the command (the SDK's client failing on an
// answer it cannot map) into an error naming it: exit 1, not a crash.
func contained(run func(*cobra.Command, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = withCode(exitFatal, fmt.Errorf("%s: the SDK failed on the API's answer: %v", cmd.CommandPath(), p))
			}
		}()
		return run(cmd, args)
	}
}

// oneID checks the single webhook id argument of ping, rotate and delete.
func oneID(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageError("%s takes one webhook ID, got %d arguments: see 'gemrecon webhooks list' for the IDs", cmd.CommandPath(), len(args))
	}
	if strings.TrimSpace(args[0]) == "" {
		return usageError("%s: the webhook ID is empty", cmd.CommandPath())
	}
	return nil
}

// webhooksRun is the RunE of a webhooks subcommand: it builds the SDK's
// WebhookService client the way poll builds its genai client (the same key
// rule, --base-url, one request timeout) and gives it to run, contained.
func (a *app) webhooksRun(f *webhooksFlags, run func(ctx context.Context, wc *interactions.Webhooks, args []string) error) func(*cobra.Command, []string) error {
	return contained(func(cmd *cobra.Command, args []string) error {
		switch f.backend {
		case "gemini":
		case "vertex":
			return usageError("--backend vertex: the WebhookService is the Gemini API's only (Vertex AI sends no notifications for batch prediction jobs; use poll there)")
		default:
			return usageError("--backend %q: webhooks work with the Gemini API only (--backend gemini)", f.backend)
		}
		key := poller.EnvAPIKey()
		if key == "" {
			return withCode(exitFatal, poller.ErrNoAPIKey)
		}
		c, err := genai.NewClient(cmd.Context(), &genai.ClientConfig{
			APIKey:      key,
			Backend:     genai.BackendGeminiAPI,
			HTTPClient:  &http.Client{Timeout: poller.DefaultRequestTimeout},
			HTTPOptions: genai.HTTPOptions{BaseURL: f.baseURL, APIVersion: poller.APIVersionGemini},
		})
		if err != nil {
			return withCode(exitFatal, fmt.Errorf("genai client: %w", err))
		}
		return run(cmd.Context(), c.Webhooks, args)
	})
}

// noRetries is for calls whose repetition is not harmless: a create retried
// after a lost answer registers a second webhook whose secret nobody has;
// a rotate or delete retried answers for the second call, not the first.
var noRetries = operations.WithRetries(retry.Config{Strategy: "none"})

// apiError shows an error from the service with its status and message;
// advice, if any, is appended.
func apiError(what string, err error, advice ...string) error {
	tail := ""
	for _, a := range advice {
		tail += "; " + a
	}
	ae, ok := errors.AsType[*apierrors.APIError](err)
	if !ok {
		return withCode(exitFatal, fmt.Errorf("%s: %w%s", what, err, tail))
	}
	var body struct {
		Error struct {
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	msg := canon.Quote(strings.TrimSpace(ae.Body))
	if json.Unmarshal([]byte(ae.Body), &body) == nil && body.Error.Message != "" {
		msg = body.Error.Message
		if body.Error.Status != "" {
			msg = body.Error.Status + ": " + msg
		}
	}
	hint := ""
	switch ae.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		hint = " (check GEMINI_API_KEY, or GOOGLE_API_KEY, which wins when both are set)"
	case http.StatusNotFound:
		hint = " (see 'gemrecon webhooks list' for the IDs)"
	}
	return withCode(exitFatal, fmt.Errorf("%s: the API answered %d %s%s%s", what, ae.StatusCode, printable(msg), hint, tail))
}

// secretFile is a --secret-file opened before the API call, so that a path
// that cannot be written is found before a secret exists.
type secretFile struct {
	path    string
	f       *os.File
	created bool // the file did not exist: remove it if nothing gets written
	needNL  bool // the existing contents do not end with a newline
}

// reserveSecretFile creates path (mode 0600) for create; it must not exist.
// No path (no --secret-file) is no file.
func reserveSecretFile(path string) (*secretFile, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, usageError("--secret-file %s exists: refusing to overwrite a secret; choose a new path, or add a secret to it with 'gemrecon webhooks rotate ID --secret-file %s'", path, path)
	}
	if err != nil {
		return nil, withCode(exitFatal, fmt.Errorf("--secret-file: %w", err))
	}
	return &secretFile{path: path, f: f, created: true}, nil
}

// openSecretFileForAppend opens path for rotate: an existing file must
// already be one serve reads (so the appended secret does not make serve
// refuse to start); a missing one is created with mode 0600. No path is no
// file.
func (a *app) openSecretFileForAppend(path string) (*secretFile, error) {
	old, err := os.ReadFile(path)
	switch {
	case path == "" || errors.Is(err, os.ErrNotExist):
		return reserveSecretFile(path)
	case err != nil:
		return nil, withCode(exitFatal, fmt.Errorf("--secret-file: %w", err))
	}
	if _, err := webhook.LoadSecrets("", path); err != nil {
		return nil, usageError("--secret-file %s: %v; fix the file before a secret is added to it", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, withCode(exitFatal, fmt.Errorf("--secret-file: %w", err))
	}
	if w := looseSecretFile(path); w != "" {
		fmt.Fprintf(a.stderr, "warning: %s\n", w)
	}
	return &secretFile{path: path, f: f, needNL: len(old) > 0 && old[len(old)-1] != '\n'}, nil
}

// looseSecretFile says what to do about the secret file at path when its
// mode lets its group or others in (any of the 0o077 bits); "" when it
// does not, or cannot be read (no --secret-file: path ""). rotate prints it
// when it appends to such a file, serve logs it when it reads one.
func looseSecretFile(path string) string {
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm()&0o077 == 0 {
		return ""
	}
	return fmt.Sprintf("%s is readable by others (mode %04o); run: chmod 600 %s", path, st.Mode().Perm(), path)
}

// abandon removes a file this command created and left empty (nil: no
// --secret-file).
func (s *secretFile) abandon() {
	if s == nil {
		return
	}
	s.f.Close()
	if s.created {
		os.Remove(s.path)
	}
}

// write appends a comment line and the secret, and makes them durable.
func (s *secretFile) write(comment, secret string) error {
	text := "# " + comment + "\n" + secret + "\n"
	if s.needNL {
		text = "\n" + text
	}
	_, err := s.f.WriteString(text)
	if err == nil {
		err = s.f.Sync()
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.abandon() // no half-written secret left behind (closing again is harmless)
		return err
	}
	if s.created { // the new name must survive a crash too
		if d, err := os.Open(filepath.Dir(s.path)); err == nil {
			_ = d.Sync()
			d.Close()
		}
	}
	return nil
}

// webhooksCreateOptions are the flags of webhooksCreate.
type webhooksCreateOptions struct {
	uri    string
	events string
	name   string
	file   string
	evs    []webhooks.WebhookSubscribedEvent // --events, read by check
}

func (a *app) webhooksCreateCommand(f *webhooksFlags) *cobra.Command {
	var o webhooksCreateOptions
	cmd := &cobra.Command{
		Use:   "create --url URL [--events LIST] [--name N] [--secret-file PATH]",
		Short: "Register a static webhook and get its signing secret (shown once)",
		Long:  webhooksCreateLong,
		Example: `  gemrecon webhooks create --url https://hooks.example.com/webhook --secret-file /etc/gemrecon/whsec
  gemrecon webhooks create --url https://hooks.example.com/webhook --events batch.succeeded,batch.failed --name nightly`,
		Args:    exactArgs(0),
		PreRunE: func(*cobra.Command, []string) error { return o.check() },
		RunE: a.webhooksRun(f, func(ctx context.Context, wc *interactions.Webhooks, _ []string) error {
			return a.runWebhooksCreate(ctx, wc, &o)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&o.uri, "url", "", "where the API sends events: serve's public URL and --path (required)")
	fl.StringVar(&o.events, "events", defaultEvents, "comma-separated event types to subscribe to")
	fl.StringVar(&o.name, "name", "gemrecon", "the webhook's name, shown by list")
	fl.StringVar(&o.file, "secret-file", "", "write the signing secret to this new file (mode 0600) instead of stdout")
	return cmd
}

const webhooksCreateLong = `Register a static webhook: the Gemini API will POST every subscribed event of
this project to --url, signed with a whsec_ secret that it returns only this
once. Without --secret-file the ID and the secret are printed ("id: …",
"secret: whsec_…"); with --secret-file PATH the secret is written to PATH
(mode 0600, the format serve --secret-file reads) and only the ID is printed.
PATH must not exist (add a secret to one with 'webhooks rotate').

A create is never retried: if the answer is lost, run 'gemrecon webhooks
list' to see whether the webhook exists before trying again.`

// handOverSecret prints a created webhook's ID and gives its secret to the
// user: on stdout, or written to --secret-file.
func (a *app) handOverSecret(o *webhooksCreateOptions, w *webhooks.Webhook, id, secret string, sf *secretFile) error {
	fmt.Fprintf(a.stdout, "id: %s\n", printable(id))
	what := fmt.Sprintf("Created webhook %s for %s (events: %s).", printable(id), printable(w.URI), printable(strings.Join(eventNames(w.SubscribedEvents), ",")))
	if sf == nil {
		fmt.Fprintf(a.stdout, "secret: %s\n", secret)
		fmt.Fprintln(a.stderr, what+`
The signing secret is shown only this once. Give it to serve:
  GEMRECON_WEBHOOK_SECRET=whsec_… gemrecon serve …
or put it on a line of its own in a file (mode 0600) and run: gemrecon serve --secret-file FILE …
Next time, --secret-file PATH writes it there for you.`)
		return nil
	}
	comment := fmt.Sprintf("gemrecon webhooks create: webhook %s (%s), %s", id, w.URI, time.Now().UTC().Format(time.RFC3339))
	if err := sf.write(printable(comment), secret); err != nil {
		return withCode(exitFatal, fmt.Errorf("webhook %s was created, but its secret could not be written to %s: %v; get a new secret with 'gemrecon webhooks rotate %s --now --secret-file PATH', or remove the webhook with 'gemrecon webhooks delete %s'", id, o.file, err, id, id))
	}
	fmt.Fprintf(a.stderr, "%s\nThe signing secret is in %s (mode 0600). Start serve with: gemrecon serve --secret-file %s …\n", what, o.file, o.file)
	return nil
}

// check refuses a wrong --url or --events (exit 2) before the credentials
// are looked at, and reads the events.
func (o *webhooksCreateOptions) check() error {
	if o.uri == "" {
		return usageError("--url is required: the address of gemrecon serve's webhook path, e.g. https://hooks.example.com/webhook")
	}
	if u, err := url.Parse(o.uri); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageError("--url %s: want an absolute http(s) URL such as https://hooks.example.com/webhook", canon.Quote(o.uri))
	}
	for _, e := range strings.Split(o.events, ",") {
		ev := webhooks.WebhookSubscribedEvent(strings.TrimSpace(e))
		if ev == "" {
			return usageError("--events %s: an empty event name; want a comma-separated list such as %s", canon.Quote(o.events), defaultEvents)
		}
		if !slices.Contains(o.evs, ev) {
			o.evs = append(o.evs, ev)
		}
	}
	return nil
}

// runWebhooksCreate does the work of webhooksCreate.
func (a *app) runWebhooksCreate(ctx context.Context, wc *interactions.Webhooks, o *webhooksCreateOptions) error {
	sf, err := reserveSecretFile(o.file)
	if err != nil {
		return err
	}
	in := webhooks.WebhookInput{SubscribedEvents: o.evs, URI: o.uri}
	if o.name != "" {
		in.Name = &o.name
	}
	res, err := wc.Create(ctx, operations.CreateWebhookRequest{Body: in}, noRetries)
	if err != nil {
		sf.abandon()
		if dial, ok := errors.AsType[*net.OpError](err); ok && dial.Op == "dial" {
			// No connection, so no request: nothing can have been created.
			return apiError("webhooks create", err, "could not connect, so nothing was created: check --base-url (or GOOGLE_GEMINI_BASE_URL) and the network, then try again")
		}
		if ae, ok := errors.AsType[*apierrors.APIError](err); !ok || ae.StatusCode >= 500 {
			return apiError("webhooks create", err, "the webhook may have been created before the answer was lost: run 'gemrecon webhooks list' before trying again")
		}
		return apiError("webhooks create", err)
	}
	w := cmp.Or(res.Webhook, &webhooks.Webhook{})
	id, secret := deref(w.ID), deref(w.NewSigningSecret)
	if id == "" || secret == "" {
		sf.abandon()
		return withCode(exitFatal, fmt.Errorf("webhooks create: the API's answer has no id or no new_signing_secret (id %s); see 'gemrecon webhooks list', and rotate or delete that webhook", canon.Quote(id)))
	}
	return a.handOverSecret(o, w, id, secret, sf)
}

// eventNames are the events as strings (never nil: [] in JSON).
func eventNames(evs []webhooks.WebhookSubscribedEvent) []string {
	s := make([]string, len(evs))
	for i, e := range evs {
		s[i] = string(e)
	}
	return s
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

// webhookJSON is one webhook in `webhooks list --json`: the API's fields and
// names.
type webhookJSON struct {
	ID               string       `json:"id"`
	Name             string       `json:"name,omitempty"`
	URI              string       `json:"uri"`
	State            string       `json:"state,omitempty"`
	SubscribedEvents []string     `json:"subscribed_events"`
	SigningSecrets   []secretJSON `json:"signing_secrets"`
	CreateTime       *time.Time   `json:"create_time,omitempty"`
	UpdateTime       *time.Time   `json:"update_time,omitempty"`
}

type secretJSON struct {
	TruncatedSecret string     `json:"truncated_secret,omitempty"`
	ExpireTime      *time.Time `json:"expire_time,omitempty"`
}

func toJSON(w webhooks.Webhook) webhookJSON {
	out := webhookJSON{ID: deref(w.ID), Name: deref(w.Name), URI: w.URI, State: string(deref(w.State)),
		SubscribedEvents: eventNames(w.SubscribedEvents), SigningSecrets: []secretJSON{},
		CreateTime: w.CreateTime, UpdateTime: w.UpdateTime}
	for _, s := range w.SigningSecrets {
		out.SigningSecrets = append(out.SigningSecrets, secretJSON{TruncatedSecret: deref(s.TruncatedSecret), ExpireTime: s.ExpireTime})
	}
	return out
}

// secretsSummary says how many secrets sign and when the first one ends.
func secretsSummary(ss []secretJSON) string {
	first := expiry(ss, -1)
	if first == nil {
		return strconv.Itoa(len(ss))
	}
	return fmt.Sprintf("%d (one expires %s)", len(ss), first.UTC().Format(time.RFC3339))
}

// expiry is the earliest (want -1) or the latest (want 1) expire time of
// the secrets; nil when none has one.
func expiry(ss []secretJSON, want int) (t *time.Time) {
	for _, s := range ss {
		if s.ExpireTime != nil && (t == nil || s.ExpireTime.Compare(*t) == want) {
			t = s.ExpireTime
		}
	}
	return t
}

const maxListPages = 10000

func (a *app) webhooksListCommand(f *webhooksFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the project's static webhooks",
		Long:  webhooksListLong,
		Example: `  gemrecon webhooks list
  gemrecon webhooks list --json | jq -r '.[] | select(.state != "enabled") | .id'`,
		Args: exactArgs(0),
		RunE: a.webhooksRun(f, func(ctx context.Context, wc *interactions.Webhooks, _ []string) error {
			return a.runWebhooksList(ctx, wc, asJSON)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

const webhooksListLong = `List every static webhook of the project (all pages): ID, name, state,
events, signing secrets (how many, and when the previous one expires after a
rotation) and URL. --json prints an array with the API's field names. A
webhook in state disabled_due_to_failed_deliveries gets no events: fix the
receiver, then run 'gemrecon webhooks enable ID'.`

// runWebhooksList does the work of webhooksList.
func (a *app) runWebhooksList(ctx context.Context, wc *interactions.Webhooks, asJSON bool) error {
	all := []webhookJSON{} // [] in JSON when there are none
	var token *string
	seen := map[string]bool{}
	for page := 0; ; page++ {
		if page == maxListPages {
			return withCode(exitFatal, fmt.Errorf("webhooks list: more than %d pages; the API keeps handing out page tokens", maxListPages))
		}
		res, err := wc.List(ctx, operations.ListWebhooksRequest{PageSize: genai.Ptr(100), PageToken: token})
		if err != nil {
			return apiError("webhooks list", err)
		}
		for _, w := range res.WebhookListResponse.GetWebhooks() {
			all = append(all, toJSON(w))
		}
		token = res.WebhookListResponse.GetNextPageToken()
		if token == nil || *token == "" {
			break
		}
		if seen[*token] {
			return withCode(exitFatal, errors.New("webhooks list: the API repeated a page token; stopping instead of looping"))
		}
		seen[*token] = true
	}
	if asJSON {
		return writeJSON(a.stdout, all)
	}
	if len(all) == 0 {
		fmt.Fprintln(a.stderr, "No webhooks: register one with 'gemrecon webhooks create --url URL'.")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tEVENTS\tSECRETS\tURL")
	for _, w := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(w.ID), printable(w.Name), printable(w.State),
			printable(strings.Join(w.SubscribedEvents, ",")), secretsSummary(w.SigningSecrets), printable(w.URI))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, w := range all {
		if w.State == string(webhooks.WebhookStateDisabledDueToFailedDeliveries) {
			fmt.Fprintf(a.stderr, "Webhook %s gets no events: the API disabled it after failed deliveries. Fix the receiver, then run 'gemrecon webhooks enable %s'.\n", printable(w.ID), printable(w.ID))
		}
	}
	return nil
}

func (a *app) webhooksPingCommand(f *webhooksFlags) *cobra.Command {
	return a.idCommand(f, &cobra.Command{
		Use:   "ping ID",
		Short: "Ask the API to send a test event to a webhook",
		Long: `Ask the API to send a test event, signed like every delivery, to the
webhook's URL; look for it in serve's log and metrics (a 401 there: serve
lacks this webhook's secret). It names no batch, so serve records nothing.`,
		Example: `  gemrecon webhooks ping ID`,
	}, "ping sent to", func(ctx context.Context, wc *interactions.Webhooks, id string) error {
		_, err := wc.Ping(ctx, operations.PingWebhookRequest{ID: id, Body: &webhooks.PingWebhookRequest{}})
		return err
	})
}

// idCommand completes cmd, a webhooks subcommand that makes one call on the
// webhook ID it is given: an error of the call is shown as apiError shows
// it, and success as "DONE webhook ID".
func (a *app) idCommand(f *webhooksFlags, cmd *cobra.Command, done string, call func(context.Context, *interactions.Webhooks, string) error) *cobra.Command {
	cmd.Args = oneID
	cmd.RunE = a.webhooksRun(f, func(ctx context.Context, wc *interactions.Webhooks, args []string) error {
		if err := call(ctx, wc, args[0]); err != nil {
			return apiError("webhooks "+cmd.Name()+" "+printable(args[0]), err)
		}
		fmt.Fprintf(a.stdout, "%s webhook %s\n", done, printable(args[0]))
		return nil
	})
	return cmd
}

func (a *app) webhooksRotateCommand(f *webhooksFlags) *cobra.Command {
	var now bool
	var file string
	cmd := &cobra.Command{
		Use:   "rotate ID [--now] [--secret-file PATH]",
		Short: "Give a webhook a new signing secret; the old one stays valid for 24 h unless --now",
		Long:  webhooksRotateLong,
		Example: `  gemrecon webhooks rotate ID --secret-file /etc/gemrecon/whsec && systemctl restart gemrecon
  gemrecon webhooks rotate ID        # prints the new secret; then GEMRECON_WEBHOOK_SECRET="whsec_new whsec_old"
  gemrecon webhooks rotate ID --now  # the old secret leaked: revoke it at once`,
		Args: oneID,
		RunE: a.webhooksRun(f, func(ctx context.Context, wc *interactions.Webhooks, args []string) error {
			return a.runWebhooksRotate(ctx, wc, args[0], now, file)
		}),
	}
	cmd.Flags().BoolVar(&now, "now", false, "revoke the previous secrets immediately instead of after 24 h")
	cmd.Flags().StringVar(&file, "secret-file", "", "append the new secret to this file (created with mode 0600 if missing) instead of printing it")
	return cmd
}

const webhooksRotateLong = `Give the webhook a new signing secret. The previous secrets stay valid for 24
hours (give serve the new one alongside the old meanwhile); --now revokes them
at once, and deliveries fail verification (401, retried by the API) until
serve has the new secret. Without --secret-file the secret is printed
("secret: whsec_…"); with it, it is appended to PATH (created with mode 0600
if missing; an existing one must already be a file serve accepts). serve
reads its secrets at start: restart it afterwards. A rotation is never
retried: if the answer is lost, rotate again.`

// runWebhooksRotate does the work of webhooksRotate.
func (a *app) runWebhooksRotate(ctx context.Context, wc *interactions.Webhooks, id string, now bool, file string) error {
	sf, err := a.openSecretFileForAppend(file)
	if err != nil {
		return err
	}
	behavior := webhooks.RevocationBehaviorRevokePreviousSecretsAfterH24
	if now {
		behavior = webhooks.RevocationBehaviorRevokePreviousSecretsImmediately
	}
	res, err := wc.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: id,
		Body: webhooks.RotateSigningSecretRequest{RevocationBehavior: behavior.ToPointer()}}, noRetries)
	if err != nil {
		sf.abandon()
		return apiError("webhooks rotate "+printable(id), err)
	}
	secret := deref(res.WebhookRotateSigningSecretResponse.GetSecret())
	if secret == "" {
		sf.abandon()
		return withCode(exitFatal, fmt.Errorf("webhooks rotate %s: the API's answer has no secret; rotate again", printable(id)))
	}
	until := a.previousSecretsEnd(ctx, wc, id, now)
	if sf != nil {
		comment := fmt.Sprintf("gemrecon webhooks rotate %s, %s; previous secrets %s", id, time.Now().UTC().Format(time.RFC3339), until)
		if err := sf.write(printable(comment), secret); err != nil {
			advice := "the previous secrets stay valid " + until + ": rotate again to get another one"
			if now {
				advice = "the previous secrets are revoked: run 'gemrecon webhooks rotate " + id + " --now' again and give serve that secret"
			}
			return withCode(exitFatal, fmt.Errorf("webhook %s has a new secret, but it could not be appended to %s: %v; %s", printable(id), file, err, advice))
		}
	} else {
		fmt.Fprintf(a.stdout, "secret: %s\n", secret)
	}
	a.explainRotation(printable(id), file, until, now)
	return nil
}

// previousSecretsEnd reads back when the previous secrets expire ("valid
// until T"), best effort: the rotation itself has succeeded.
func (a *app) previousSecretsEnd(ctx context.Context, wc *interactions.Webhooks, id string, now bool) string {
	if now {
		return "revoked now"
	}
	if res, err := wc.Get(ctx, operations.GetWebhookRequest{ID: id}); err == nil && res.Webhook != nil {
		if last := expiry(toJSON(*res.Webhook).SigningSecrets, 1); last != nil {
			return "valid until " + last.UTC().Format(time.RFC3339)
		}
	}
	return "valid for 24 h"
}

func (a *app) explainRotation(id, file, until string, now bool) {
	w := a.stderr
	if now {
		fmt.Fprintf(w, "Rotated the signing secret of webhook %s; the previous secrets are revoked now.\n", id)
		fmt.Fprintln(w, "Deliveries are signed with the new secret only: serve answers them 401 (the API retries) until it has it.")
	} else {
		fmt.Fprintf(w, "Rotated the signing secret of webhook %s; the previous secrets stay %s.\n", id, until)
		fmt.Fprintln(w, "Give serve the new secret alongside the old one before then: serve accepts a delivery that any of its secrets verifies.")
	}
	if file != "" {
		fmt.Fprintf(w, "The new secret was appended to %s; serve --secret-file reads one secret per line and accepts any of them.\n", file)
		fmt.Fprintf(w, "Restart serve (it reads its secrets at start): gemrecon serve --secret-file %s …\n", file)
		if !now {
			fmt.Fprintln(w, "After the old secret expires, its line may be removed.")
		}
		return
	}
	if now {
		fmt.Fprintln(w, "Give serve the new secret and restart it, as a line of its --secret-file FILE or as")
		fmt.Fprintln(w, `  GEMRECON_WEBHOOK_SECRET="whsec_NEW" gemrecon serve …`)
		return
	}
	fmt.Fprintln(w, "Give serve both secrets and restart it, either as a file with one secret per line:")
	fmt.Fprintln(w, "  gemrecon serve --secret-file FILE …")
	fmt.Fprintln(w, "or in the environment, separated by a space or a comma:")
	fmt.Fprintln(w, `  GEMRECON_WEBHOOK_SECRET="whsec_NEW whsec_OLD" gemrecon serve …`)
	fmt.Fprintln(w, "Next time, rotate --secret-file FILE appends the new secret for you.")
}

func (a *app) webhooksEnableCommand(f *webhooksFlags) *cobra.Command {
	return a.idCommand(f, &cobra.Command{
		Use:   "enable ID",
		Short: "Enable a webhook again, such as one the API disabled after failed deliveries",
		Long: `Set the webhook's state to enabled, such as one the API disabled after failed
deliveries (disabled_due_to_failed_deliveries); the events it missed are not
sent again, but the next poll pass lists those completions.`,
		Example: `  gemrecon webhooks enable ID`,
	}, "enabled", func(ctx context.Context, wc *interactions.Webhooks, id string) error {
		res, err := wc.Update(ctx, operations.UpdateWebhookRequest{ID: id, UpdateMask: genai.Ptr("state"),
			Body: webhooks.WebhookUpdate{State: webhooks.WebhookUpdateStateEnabled.ToPointer()}})
		if err != nil {
			return err
		}
		if st := string(deref(cmp.Or(res.Webhook, &webhooks.Webhook{}).State)); st != string(webhooks.WebhookStateEnabled) {
			return fmt.Errorf("the API answered state %s; see 'gemrecon webhooks list'", canon.Quote(st))
		}
		return nil
	})
}

func (a *app) webhooksDeleteCommand(f *webhooksFlags) *cobra.Command {
	return a.idCommand(f, &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a static webhook: the API stops sending it events",
		Long: `Delete the webhook: the API sends it no more events; poll still finds the
completions. A delete is never retried: if the answer is lost, 'gemrecon
webhooks list' tells whether it is gone.`,
		Example: `  gemrecon webhooks delete ID`,
	}, "deleted", func(ctx context.Context, wc *interactions.Webhooks, id string) error {
		_, err := wc.Delete(ctx, operations.DeleteWebhookRequest{ID: id}, noRetries)
		return err
	})
}
