package canon_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/canon"
)

func TestKey(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"projects/p/locations/us/operations/abc-123/", "gemini:operations/abc-123"},
		{"operations/abc-123", "gemini:operations/abc-123"},
		{"batches/x", "gemini:batches/x"},
		{"batchJobs/x", "gemini:batches/x"},
		{"bAtChJoBs/x", "gemini:batches/x"},
		{"BatchPredictionJobs/1", "gemini:batchPredictionJobs/1"},
		{"projects/p/locations/l/batchPredictionJobs/1", "gemini:batchPredictionJobs/1"},
		{"models/m/operations/o", "gemini:operations/o"},
		{"batches/Abc", "gemini:batches/Abc"},
		{"batches/abc", "gemini:batches/abc"},
		{"https://generativelanguage.googleapis.com/v1beta/batches/x", "gemini:batches/x"},
		{"https://generativelanguage.googleapis.com/v1beta1/batches/x", "gemini:batches/x"},
		{"HTTPS://HOST/v1/batches/x", "gemini:batches/x"},
		{"https://host/v1beta", ""},
		{"https://host/v1beta/foo", "gemini:foo"},
		{"https://host/v1beta2x/foo", "gemini:v1beta2x/foo"}, // not an API version
		{"https://host/vbeta/foo", "gemini:vbeta/foo"},       // not an API version
		{"https://host//v1beta//batches/x", "gemini:batches/x"},
		{"v1beta/foo", "gemini:v1beta/foo"}, // a version is stripped from URLs only
		{"a/b://host/x", "gemini:a/b://host/x"},
		{"gemini:gemini:batches/x", "gemini:batches/x"},
		{"gemini: gemini:foo", "gemini:foo"},
		{"gemini://host/foo", "gemini://host/foo"},
		{"Gemini:batches/x", "gemini:batches/x"},
		{"GEMINI:foo", "gemini:foo"},
		{"batches/x:cancel", "gemini:batches/x:cancel"},
		{"batches//x", "gemini:batches//x"},
		{"batches/", "gemini:batches"},
		{"batches", "gemini:batches"},
		{"batches/batches", "gemini:batches/batches"},
		{" x ", "gemini:x"},
		{"", ""},
		{"  ", ""},
		{"/ /", ""},
		{strings.Repeat(" ", 1000), ""},
	}
	for _, tt := range tests {
		got, err := canon.Key(tt.in)
		if tt.want == "" {
			if err == nil || !errors.Is(err, canon.ErrEmptyName) || len(err.Error()) > 200 {
				t.Errorf("Key(%q) = %q, %v, want a short ErrEmptyName error", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Key(%q) = %q, %v, want %q", tt.in, got, err, tt.want)
			continue
		}
		if again, err := canon.Key(got); err != nil || again != got {
			t.Errorf("Key(%q) = %q, %v, want %q (idempotence)", got, again, err, got)
		}
		if name := canon.Name(tt.in); name != strings.TrimPrefix(tt.want, canon.Prefix) {
			t.Errorf("Name(%q) = %q, want %q", tt.in, name, strings.TrimPrefix(tt.want, canon.Prefix))
		}
	}
}

func TestIdsDifferingInCaseGiveDistinctKeys(t *testing.T) {
	for _, pair := range [][2]string{
		{"batches/abc", "batches/ABC"},
		{"operations/Op-1", "operations/op-1"},
		{"projects/p/locations/l/batchPredictionJobs/aB", "projects/p/locations/l/batchPredictionJobs/Ab"},
	} {
		a, errA := canon.Key(pair[0])
		b, errB := canon.Key(pair[1])
		if errA != nil || errB != nil || a == b {
			t.Errorf("Key(%q) = %q, %v and Key(%q) = %q, %v, want two distinct keys", pair[0], a, errA, pair[1], b, errB)
		}
	}
}

func TestName(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"gemini:batches/x", "batches/x"},
		{"batches/x", "batches/x"},
		{"gemini:projects/p/locations/us/operations/abc-123/", "operations/abc-123"},
		{"BATCHJOBS/x", "batches/x"},
		{"gemini:abc", "abc"},
		{"gemini:", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := canon.Name(tt.in); got != tt.want {
			t.Errorf("Name(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := canon.Name(canon.Name(tt.in)); got != tt.want {
			t.Errorf("Name(Name(%q)) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestBareIDKeys(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{"gemini:demo-quota", []string{"gemini:batches/demo-quota", "gemini:batchPredictionJobs/demo-quota", "gemini:operations/demo-quota"}},
		{"demo-quota", []string{"gemini:batches/demo-quota", "gemini:batchPredictionJobs/demo-quota", "gemini:operations/demo-quota"}},
		{"gemini:batches/demo-quota", nil}, // names its collection already
		{"gemini:tunedModels/x", nil},      // a name of another shape: not a bare id
		{"gemini:batches", nil},            // a collection word, no id
		{"gemini:", nil},
		{"", nil},
	} {
		if got := canon.BareIDKeys(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("BareIDKeys(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestNormalizeState(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"BATCH_STATE_SUCCEEDED", "SUCCEEDED"},
		{"JOB_STATE_SUCCEEDED", "SUCCEEDED"},
		{"succeeded", "SUCCEEDED"},
		{"SUCCEEDED", "SUCCEEDED"},
		{" batch_state_running ", "RUNNING"},
		{"JOB_STATE_PARTIALLY_SUCCEEDED", "PARTIALLY_SUCCEEDED"},
		{"batch.succeeded", "SUCCEEDED"},
		{"Batch.Failed", "FAILED"},
		{"batch.canceled", "CANCELLED"},
		{"CANCELED", "CANCELLED"},
		{"JOB_STATE_CANCELLING", "CANCELLING"},
		{"SOMETHING_NEW", "SOMETHING_NEW"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := canon.NormalizeState(tt.in); got != tt.want {
			t.Errorf("NormalizeState(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := canon.NormalizeState(tt.want); got != tt.want {
			t.Errorf("NormalizeState(%q) = %q, want %q (idempotence)", tt.want, got, tt.want)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"SUCCEEDED", true},
		{"BATCH_STATE_SUCCEEDED", true},
		{"JOB_STATE_FAILED", true},
		{"BATCH_STATE_CANCELLED", true},
		{"canceled", true},
		{"BATCH_STATE_EXPIRED", true},
		{"JOB_STATE_PARTIALLY_SUCCEEDED", true},
		{"BATCH_STATE_PENDING", false},
		{"BATCH_STATE_RUNNING", false},
		{"JOB_STATE_QUEUED", false},
		{"JOB_STATE_CANCELLING", false},
		{"JOB_STATE_PAUSED", false},
		{"JOB_STATE_UPDATING", false},
		{"BATCH_STATE_UNSPECIFIED", false},
		{"SOMETHING_NEW", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := canon.IsTerminal(tt.in); got != tt.want {
			t.Errorf("IsTerminal(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestEventTypes(t *testing.T) {
	tests := []struct {
		typ        string
		batch      bool
		completion bool
		state      string
	}{
		{"batch.succeeded", true, true, "SUCCEEDED"},
		{"batch.failed", true, true, "FAILED"},
		{"batch.cancelled", true, true, "CANCELLED"},
		{"batch.canceled", true, true, "CANCELLED"},
		{"batch.expired", true, true, "EXPIRED"},
		{"batch.completed", true, true, ""},
		{"batch.partially_succeeded", true, true, "PARTIALLY_SUCCEEDED"},
		{"BATCH.SUCCEEDED", true, true, "SUCCEEDED"},
		{"batch.running", true, false, "RUNNING"},
		{"batch.created", true, false, "CREATED"},
		{"batch.", false, false, ""},
		{"batches.succeeded", false, false, ""},
		{"interaction.completed", false, false, ""},
		{"", false, false, ""},
	}
	for _, tt := range tests {
		if got := canon.IsBatchType(tt.typ); got != tt.batch {
			t.Errorf("IsBatchType(%q) = %v, want %v", tt.typ, got, tt.batch)
		}
		if got := canon.IsCompletionType(tt.typ); got != tt.completion {
			t.Errorf("IsCompletionType(%q) = %v, want %v", tt.typ, got, tt.completion)
		}
		if got := canon.StateFromType(tt.typ); got != tt.state {
			t.Errorf("StateFromType(%q) = %q, want %q", tt.typ, got, tt.state)
		}
	}
}

// TestOneCompletionOneKey is the point of the package: every way the same
// completion reaches gemrecon gives the same key.
func TestOneCompletionOneKey(t *testing.T) {
	const want = "gemini:batches/aaa111"
	listed := `{"name":"batches/aaa111","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}`
	webhook := `{"type":"batch.succeeded","version":"v1","data":{"id":"aaa111"}}`
	pubsub := `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(webhook)) + `"},"subscription":"s"}`
	for _, body := range []string{listed, webhook, pubsub,
		`{"operation":{"name":"batches/aaa111"}}`,
		`{"resourceName":"https://generativelanguage.googleapis.com/v1beta/batches/aaa111/"}`,
		`{"data":{"operationName":"batchJobs/aaa111"}}`,
	} {
		ev, err := canon.FromEvent([]byte(body))
		if err != nil || ev.Key != want || !ev.Terminal {
			t.Errorf("FromEvent(%s) = %q (terminal %v), %v, want %q (terminal)", body, ev.Key, ev.Terminal, err, want)
		}
	}
	for _, name := range []string{"batches/aaa111", "gemini:batches/aaa111", " batches/aaa111/ ", "BatchJobs/aaa111"} {
		if got, err := canon.Key(name); err != nil || got != want {
			t.Errorf("Key(%q) = %q, %v, want %q", name, got, err, want)
		}
	}
}

func TestFromEventOperationIsACopy(t *testing.T) {
	body := []byte(` {"name":"batches/x","done":true} `)
	ev, err := canon.FromEvent(body)
	if err != nil {
		t.Fatalf("FromEvent(%s) error: %v", body, err)
	}
	if want := `{"name":"batches/x","done":true}`; string(ev.Operation) != want {
		t.Fatalf("FromEvent(%s).Operation = %s, want %s", body, ev.Operation, want)
	}
	for i := range body {
		body[i] = 'X' // the caller reuses its buffer
	}
	if want := `{"name":"batches/x","done":true}`; string(ev.Operation) != want {
		t.Errorf("Operation after the body was overwritten = %s, want %s", ev.Operation, want)
	}
}

func TestFromEventPubSubOperationIsThePayload(t *testing.T) {
	payload := `{"type":"batch.succeeded","data":{"id":"x"}}`
	body := `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(payload)) + `","messageId":"9"},"subscription":"s"}`
	ev, err := canon.FromEvent([]byte(body))
	if err != nil || string(ev.Operation) != payload || ev.Type != "batch.succeeded" {
		t.Errorf("FromEvent(%s) = Operation %s, Type %q, %v, want Operation %s, Type batch.succeeded", body, ev.Operation, ev.Type, err, payload)
	}
}

func TestFromEventPubSubNestingIsBounded(t *testing.T) {
	body := `{"name":"batches/deep"}`
	for range 5 {
		body = `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(body)) + `"}}`
	}
	if ev, err := canon.FromEvent([]byte(body)); err == nil || !strings.Contains(err.Error(), "nested") {
		t.Errorf("FromEvent(5 nested envelopes) = %q, %v, want a nesting error", ev.Key, err)
	}
}

func TestNoNameError(t *testing.T) {
	_, err := canon.FromEvent([]byte(`{"b":1,"a":2,"data":{"c":3}}`))
	var nn *canon.NoNameError
	if !errors.As(err, &nn) {
		t.Fatalf("FromEvent error = %v, want a *NoNameError", err)
	}
	if want := []string{"a", "b", "data", "data.c"}; !slices.Equal(nn.Fields, want) {
		t.Errorf("NoNameError.Fields = %q, want %q", nn.Fields, want)
	}
	if msg := nn.Error(); !strings.HasPrefix(msg, "canon: no operation name") || !strings.Contains(msg, "a, b, data, data.c") {
		t.Errorf("NoNameError.Error() = %q, want it to name the fields present", msg)
	}
	if msg := (&canon.NoNameError{}).Error(); !strings.Contains(msg, "no fields") {
		t.Errorf("NoNameError{}.Error() = %q, want it to say there were no fields", msg)
	}
}

// TestAllocations keeps the hot path cheap: the webhook receiver and the poller
// call these on every event.
func TestAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tests := []struct {
		name string
		f    func()
		max  float64
	}{
		{"Name(canonical key)", func() { _ = canon.Name("gemini:batches/x") }, 0},
		{"Name(full resource name)", func() { _ = canon.Name("projects/p/locations/us/batchPredictionJobs/1/") }, 0},
		{"Key(canonical name)", func() { _, _ = canon.Key("batches/x") }, 1},
		{"Key(URL)", func() { _, _ = canon.Key("https://generativelanguage.googleapis.com/v1beta/batches/x") }, 1},
		{"NormalizeState", func() { _ = canon.NormalizeState("BATCH_STATE_SUCCEEDED") }, 0},
		{"IsTerminal", func() { _ = canon.IsTerminal("JOB_STATE_PAUSED") }, 0},
	}
	for _, tt := range tests {
		if got := testing.AllocsPerRun(100, tt.f); got > tt.max {
			t.Errorf("%s: %v allocations, want at most %v", tt.name, got, tt.max)
		}
	}
}

// vector is one entry of testdata/canon/vectors.json (see its README).
type vector struct {
	Desc     string          `json:"desc"`
	Name     *string         `json:"name"`
	Event    json.RawMessage `json:"event"`
	Body     *string         `json:"body"`
	Key      string          `json:"key"`
	Error    string          `json:"error"`
	NoName   bool            `json:"noName"`
	State    *string         `json:"state"`
	Terminal *bool           `json:"terminal"`
	Type     *string         `json:"type"`
}

// body returns the document FromEvent reads, for event and body vectors.
func (v vector) body() []byte {
	if v.Body != nil {
		return []byte(*v.Body)
	}
	return v.Event
}

func loadVectors(tb testing.TB) []vector {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "canon", "vectors.json"))
	if err != nil {
		tb.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var vs []vector
	if err := dec.Decode(&vs); err != nil {
		tb.Fatalf("vectors.json: %v", err)
	}
	for _, v := range vs {
		inputs := 0
		for _, set := range []bool{v.Name != nil, v.Event != nil, v.Body != nil} {
			if set {
				inputs++
			}
		}
		if v.Desc == "" || inputs != 1 || (v.Key == "") == (v.Error == "") {
			tb.Fatalf("vectors.json: vector %q needs a desc, exactly one of name/event/body and exactly one of key/error", v.Desc)
		}
	}
	return vs
}

func TestVectors(t *testing.T) {
	vs := loadVectors(t)
	if len(vs) < 40 {
		t.Fatalf("vectors.json holds %d vectors, want at least 40", len(vs))
	}
	for _, v := range vs {
		t.Run(v.Desc, func(t *testing.T) {
			if v.Name != nil {
				checkNameVector(t, v)
			} else {
				checkEventVector(t, v)
			}
		})
	}
}

func checkNameVector(t *testing.T, v vector) {
	got, err := canon.Key(*v.Name)
	if v.Error != "" {
		if err == nil || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("Key(%q) = %q, %v, want an error containing %q", *v.Name, got, err, v.Error)
		}
		return
	}
	if err != nil || got != v.Key {
		t.Errorf("Key(%q) = %q, %v, want %q", *v.Name, got, err, v.Key)
		return
	}
	if again, err := canon.Key(got); err != nil || again != got {
		t.Errorf("Key(%q) = %q, %v, want %q (idempotence)", got, again, err, got)
	}
	if name := canon.Name(*v.Name); canon.Prefix+name != v.Key {
		t.Errorf("Name(%q) = %q, want %q", *v.Name, name, strings.TrimPrefix(v.Key, canon.Prefix))
	}
}

func checkEventVector(t *testing.T, v vector) {
	body := v.body()
	ev, err := canon.FromEvent(body)
	if v.Error != "" {
		if err == nil || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("FromEvent(%s) = %q, %v, want an error containing %q", body, ev.Key, err, v.Error)
		}
		var nn *canon.NoNameError
		if errors.As(err, &nn) != v.NoName {
			t.Errorf("FromEvent(%s) error %v: errors.As *NoNameError = %v, want %v", body, err, !v.NoName, v.NoName)
		}
		return
	}
	if err != nil || ev.Key != v.Key {
		t.Errorf("FromEvent(%s).Key = %q, %v, want %q", body, ev.Key, err, v.Key)
		return
	}
	if ev.Name != strings.TrimPrefix(v.Key, canon.Prefix) {
		t.Errorf("FromEvent(%s).Name = %q, want %q", body, ev.Name, strings.TrimPrefix(v.Key, canon.Prefix))
	}
	if again, err := canon.Key(ev.Key); err != nil || again != ev.Key {
		t.Errorf("Key(%q) = %q, %v, want %q (idempotence)", ev.Key, again, err, ev.Key)
	}
	if v.State != nil && ev.State != *v.State {
		t.Errorf("FromEvent(%s).State = %q, want %q", body, ev.State, *v.State)
	}
	if v.Terminal != nil && ev.Terminal != *v.Terminal {
		t.Errorf("FromEvent(%s).Terminal = %v, want %v", body, ev.Terminal, *v.Terminal)
	}
	if v.Type != nil && ev.Type != *v.Type {
		t.Errorf("FromEvent(%s).Type = %q, want %q", body, ev.Type, *v.Type)
	}
	if !json.Valid(ev.Operation) || !bytes.HasPrefix(ev.Operation, []byte("{")) {
		t.Errorf("FromEvent(%s).Operation = %s, want a JSON object", body, ev.Operation)
	}
}

func FuzzKey(f *testing.F) {
	for _, v := range loadVectors(f) {
		if v.Name != nil {
			f.Add(*v.Name)
		}
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := canon.Key(in)
		if err != nil {
			if canon.Name(in) != "" {
				t.Errorf("Key(%q) failed (%v) but Name(%q) = %q", in, err, in, canon.Name(in))
			}
			return
		}
		if !strings.HasPrefix(k, canon.Prefix) || len(k) == len(canon.Prefix) {
			t.Fatalf("Key(%q) = %q, want %q followed by a name", in, k, canon.Prefix)
		}
		if again, err := canon.Key(k); err != nil || again != k {
			t.Fatalf("Key(Key(%q)) = %q, %v, want %q", in, again, err, k)
		}
		name := canon.Name(in)
		if canon.Prefix+name != k || canon.Name(k) != name || canon.Name(name) != name {
			t.Fatalf("Name(%q) = %q, Name(%q) = %q, Name(%q) = %q, want all %q", in, name, k, canon.Name(k), name, canon.Name(name), strings.TrimPrefix(k, canon.Prefix))
		}
	})
}

func FuzzFromEvent(f *testing.F) {
	for _, v := range loadVectors(f) {
		if v.Name == nil {
			f.Add(v.body())
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := canon.FromEvent(body)
		if err != nil {
			return
		}
		if !strings.HasPrefix(ev.Key, canon.Prefix) || ev.Key != canon.Prefix+ev.Name || ev.Name == "" {
			t.Fatalf("FromEvent(%q) = key %q, name %q, want %q + a non-empty name", body, ev.Key, ev.Name, canon.Prefix)
		}
		if again, err := canon.Key(ev.Key); err != nil || again != ev.Key {
			t.Fatalf("Key(%q) = %q, %v, want %q", ev.Key, again, err, ev.Key)
		}
		if ev.State != "" && !canon.IsTerminal(ev.State) && ev.Terminal {
			t.Fatalf("FromEvent(%q): state %q is not terminal but Terminal = true", body, ev.State)
		}
		if !json.Valid(ev.Operation) {
			t.Fatalf("FromEvent(%q).Operation = %q, not JSON", body, ev.Operation)
		}
	})
}

func FuzzNormalizeState(f *testing.F) {
	for _, s := range []string{"BATCH_STATE_SUCCEEDED", "JOB_STATE_PAUSED", "batch.canceled", "batch.batch.succeeded", " job_state_x ", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := canon.NormalizeState(s)
		if again := canon.NormalizeState(n); again != n {
			t.Fatalf("NormalizeState(%q) = %q, NormalizeState(%q) = %q, want equal", s, n, n, again)
		}
		if canon.IsTerminal(s) != canon.IsTerminal(n) {
			t.Fatalf("IsTerminal(%q) = %v, IsTerminal(%q) = %v, want equal", s, canon.IsTerminal(s), n, canon.IsTerminal(n))
		}
	})
}
