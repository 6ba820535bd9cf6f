package canon

// This file keeps a second, deliberately plain implementation of FromEvent,
// written apart from it (a regexp finds surrogate escapes, its own candidate
// and key checks), as an oracle: FuzzFromEventMatchesReference checks that
// FromEvent reads every document as it does.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// candidates are the fields that may hold the operation name, in order of
// preference (spec §2).
func refCandidates() [4]string {
	return [4]string{"name", "operation", "operationName", "resourceName"}
}

// refObject is a decoded JSON object whose values are still raw.
type refObject = map[string]json.RawMessage

// refFromEvent is FromEvent written with encoding/json maps.
func refFromEvent(body []byte) (Event, error) {
	ev, err := refFromDoc(body, 0)
	if err != nil {
		typed := Event{Type: ev.Type, HasType: ev.HasType}
		if nn, ok := err.(*NoNameError); ok {
			return typed, nn // its message is already complete
		}
		return typed, fmt.Errorf("canon: %w", err)
	}
	return ev, nil
}

// refFromDoc does refFromEvent's work at one envelope depth. Its errors do not
// carry the "canon: " prefix; refFromEvent adds it once.

func refFromDoc(body []byte, depth int) (Event, error) {
	raw := bytes.TrimSpace(body)
	if len(raw) == 0 {
		return Event{}, errors.New("empty event body")
	}
	if raw[0] != '{' {
		if !json.Valid(raw) {
			return Event{}, fmt.Errorf("parsing event: %w", json.Unmarshal(raw, new(any)))
		}
		return Event{}, fmt.Errorf("%w: got %s", ErrNotObject, kind(raw))
	}
	var top refObject
	if err := json.Unmarshal(raw, &top); err != nil {
		return Event{}, fmt.Errorf("parsing event: %w", err)
	}

	if data, ok, err := refPubSubData(top); err != nil {
		return Event{}, err
	} else if ok {
		if depth >= maxPubSubDepth {
			return Event{}, fmt.Errorf("Pub/Sub envelopes nested more than %d deep", maxPubSubDepth)
		}
		ev, err := refFromDoc(data, depth+1)
		if err != nil {
			return ev, fmt.Errorf("Pub/Sub message.data: %w", err)
		}
		return ev, nil
	}

	typ, hasType := top["type"]
	ev := Event{Type: str(typ), HasType: hasType && string(typ) != "null"}
	typed := Event{Type: ev.Type, HasType: ev.HasType}
	data := refAsObject(top["data"])
	batch := IsBatchType(ev.Type)

	name, from, err := refFindName(top, data)
	if err != nil {
		return typed, err
	}
	if name == "" {
		return typed, &NoNameError{Fields: refFieldNames(top, data)}
	}
	if refCollectionOnly(name) {
		return typed, fmt.Errorf("%w: collection", ErrInvalidKey)
	}
	if batch && !strings.Contains(name, "/") {
		// The Gemini webhook names a batch by its bare id.
		name = "batches/" + name
	}
	if err := refCheckKey(Prefix + name); err != nil {
		return typed, err
	}
	ev.Name = name
	ev.Key = Prefix + name

	var st refStateScan
	st.scan(top)
	st.scan(data)
	st.scan(from)
	ev.State = st.state
	if ev.State == "" {
		ev.State = StateFromType(ev.Type)
	}
	ev.Terminal = !st.nonTerminal && !(batch && !IsCompletionType(ev.Type))

	if depth == 0 {
		ev.Operation = json.RawMessage(bytes.Clone(raw)) // body may be a reused buffer
	} else {
		ev.Operation = json.RawMessage(raw) // decoded from Pub/Sub: ours already
	}
	return ev, nil
}

// refFindName returns the canonical name of the first non-empty candidate, top
// level first, then inside data (where the webhook's id also counts), and the
// refObject that held it when the candidate was an refObject.
func refFindName(top, data refObject) (string, refObject, error) {
	for _, f := range refCandidates() {
		if n, obj, err := refCandidate(f, top[f]); err != nil || n != "" {
			return n, obj, err
		}
	}
	if data == nil {
		return "", nil, nil
	}
	for _, f := range refCandidates() {
		if n, obj, err := refCandidate("data."+f, data[f]); err != nil || n != "" {
			return n, obj, err
		}
	}
	return refCandidate("data.id", data["id"])
}

// candidate reads one name candidate: a string, or an refObject whose own
// "name" is a string. Absent, null, blank and name-less values are empty.
func refCandidate(field string, raw json.RawMessage) (string, refObject, error) {
	if len(raw) == 0 {
		return "", nil, nil
	}
	switch raw[0] {
	case 'n':
		return "", nil, nil
	case '"':
		if !refValidString(raw) {
			return "", nil, fmt.Errorf("%w: %s", ErrInvalidKey, field)
		}
		return canonName(str(raw)), nil, nil
	case '{':
		obj := refAsObject(raw)
		n := obj["name"]
		if len(n) > 0 && n[0] != '"' && n[0] != 'n' {
			return "", nil, fmt.Errorf("%w: field %q is %s, want a string", ErrFieldType, field+".name", kind(n))
		}
		if len(n) > 0 && n[0] == '"' && !refValidString(n) {
			return "", nil, fmt.Errorf("%w: %s.name", ErrInvalidKey, field)
		}
		return canonName(str(n)), obj, nil
	}
	return "", nil, fmt.Errorf("%w: field %q is %s, want a string or an refObject with a name", ErrFieldType, field, kind(raw))
}

// refEscape matches one escape of a JSON string; matched left to right, an
// escaped backslash is consumed whole, so "\\ud800" holds no \u escape.
var refEscape = regexp.MustCompile(`\\(u[0-9a-fA-F]{4}|.)`)

// refValidString reports whether the JSON string token raw decodes without
// replacement characters: its bytes are valid UTF-8 and every \u escape of a
// surrogate is a high one directly followed by an escaped low one.
func refValidString(raw json.RawMessage) bool {
	if !utf8.Valid(raw) {
		return false
	}
	esc := refEscape.FindAllSubmatchIndex(raw, -1)
	for i := 0; i < len(esc); i++ {
		r, ok := refSurrogate(raw, esc[i])
		if !ok {
			continue
		}
		if r >= 0xdc00 || i+1 == len(esc) || esc[i+1][0] != esc[i][1] {
			return false
		}
		lo, ok := refSurrogate(raw, esc[i+1])
		if !ok || lo < 0xdc00 {
			return false
		}
		i++ // the pair's low half
	}
	return true
}

// refSurrogate returns the code unit of a \u escape when it is a surrogate.
func refSurrogate(raw []byte, m []int) (rune, bool) {
	arg := string(raw[m[2]:m[3]])
	if len(arg) != 5 {
		return 0, false
	}
	v, err := strconv.ParseUint(arg[1:], 16, 32)
	if err != nil || v < 0xd800 || v > 0xdfff {
		return 0, false
	}
	return rune(v), true
}

// refCollectionOnly: the name's last segment is a collection word and the
// segment before it (if any) is not.
func refCollectionOnly(name string) bool {
	segs := strings.Split(strings.TrimRight(name, "/"), "/")
	isColl := func(s string) bool {
		for _, c := range []string{"operations", "batches", "batchJobs", "batchPredictionJobs"} {
			if strings.EqualFold(s, c) {
				return true
			}
		}
		return false
	}
	n := len(segs)
	return isColl(segs[n-1]) && (n == 1 || !isColl(segs[n-2]))
}

// refCheckKey is CheckKey written with the unicode package.
func refCheckKey(key string) error {
	if len(key) > MaxKeyLen || !utf8.ValidString(key) || strings.IndexFunc(key, unicode.IsControl) >= 0 {
		return ErrInvalidKey
	}
	return nil
}

// refStateScan gathers what the event says about its state.
type refStateScan struct {
	state       string // the first state found, normalised
	nonTerminal bool   // a non-terminal state, or "done": false, was found
}

// scan reads obj's "state", "metadata.state" and "done". Any non-terminal
// signal wins: accepting a running batch as done would run the effect on
// partial results, while ignoring an event loses nothing (the poller sees
// the completion again).
func (s *refStateScan) scan(obj refObject) {
	if obj == nil {
		return
	}
	s.add(str(obj["state"]))
	if md := refAsObject(obj["metadata"]); md != nil {
		s.add(str(md["state"]))
	}
	if done := bytes.TrimSpace(obj["done"]); string(done) == "false" {
		s.nonTerminal = true
	}
}

func (s *refStateScan) add(state string) {
	state = NormalizeState(state)
	if state == "" {
		return
	}
	if s.state == "" {
		s.state = state
	}
	if !IsTerminal(state) {
		s.nonTerminal = true
	}
}

// refPubSubData returns the decoded message.data of a Pub/Sub push envelope
// ({"message":{"data":"<base64>",…},"subscription":…}); ok is false when top
// is not one.
func refPubSubData(top refObject) (data []byte, ok bool, err error) {
	msg := refAsObject(top["message"])
	if msg == nil {
		return nil, false, nil
	}
	raw, present := msg["data"]
	if !present {
		return nil, false, nil
	}
	if len(raw) == 0 || raw[0] != '"' {
		return nil, false, fmt.Errorf("Pub/Sub message.data is %s, want a base64 string", kind(raw))
	}
	enc := strings.TrimRight(str(raw), "=")
	if enc == "" {
		return nil, false, errors.New("Pub/Sub message.data is empty")
	}
	codec := base64.RawStdEncoding
	if strings.ContainsAny(enc, "-_") {
		codec = base64.RawURLEncoding
	}
	data, err = codec.DecodeString(enc)
	if err != nil {
		return nil, false, fmt.Errorf("Pub/Sub message.data is not base64: %w", err)
	}
	return data, true, nil
}

// refFieldNames lists top's field names and data's as "data.x", sorted.
func refFieldNames(top, data refObject) []string {
	names := make([]string, 0, len(top)+len(data))
	for k := range top {
		names = append(names, k)
	}
	for k := range data {
		names = append(names, "data."+k)
	}
	slices.Sort(names)
	return names
}

// refAsObject decodes raw when it is a JSON refObject, and returns nil otherwise.
func refAsObject(raw json.RawMessage) refObject {
	if len(raw) == 0 || raw[0] != '{' {
		return nil
	}
	var obj refObject
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	if obj == nil {
		obj = refObject{}
	}
	return obj
}

func FuzzFromEventMatchesReference(f *testing.F) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "canon", "vectors.json"))
	if err != nil {
		f.Fatal(err)
	}
	var vs []struct {
		Event json.RawMessage `json:"event"`
		Body  *string         `json:"body"`
	}
	if err := json.Unmarshal(data, &vs); err != nil {
		f.Fatal(err)
	}
	for _, v := range vs {
		switch {
		case v.Body != nil:
			f.Add([]byte(*v.Body))
		case v.Event != nil:
			f.Add([]byte(v.Event))
		}
	}
	f.Add([]byte(`{"n\u0061me":"batches/esc","name":"batches/dup","name":"batches/last"}`))
	f.Add([]byte(`{"data":{"id":"x\"y"},"type":"batch.succeeded","done" : false }`))
	f.Add([]byte(`{"name":"batches/\ud800"}`))
	f.Add([]byte(`{"name":"batches/\ud83d\ude00"}`))
	f.Add([]byte(`{"name":"batches/\\ud800"}`))
	f.Add([]byte(`{"name":"batches/\udc00\ud800"}`))
	f.Add([]byte("{\"name\":\"batches/a\xff\"}"))
	f.Add([]byte(`{"name":"batches/"}`))
	f.Add([]byte(`{"type":"batch.succeeded","data":{"id":"batches/"}}`))
	f.Add([]byte(`{"name":"batches/batches"}`))
	f.Add([]byte(`{"type":null,"name":"batches/n"}`))
	f.Add([]byte(`{"type":7,"data":{"x":1}}`))
	f.Add([]byte(`{"name":"batches/\u0000"}`))
	f.Add([]byte(`{"name":"batches/\u0085"}`))
	f.Add([]byte(`{"operation":{"name":"batches/\ud800x"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, gotErr := FromEvent(body)
		want, wantErr := refFromEvent(body)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("FromEvent(%q) error = %v, reference error = %v", body, gotErr, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("FromEvent(%q) = %+v, reference = %+v", body, got, want)
		}
		if errors.Is(gotErr, ErrInvalidKey) != errors.Is(wantErr, ErrInvalidKey) {
			t.Fatalf("FromEvent(%q) error = %v, reference error = %v: only one is ErrInvalidKey", body, gotErr, wantErr)
		}
		if errors.Is(gotErr, ErrFieldType) != errors.Is(wantErr, ErrFieldType) {
			t.Fatalf("FromEvent(%q) error = %v, reference error = %v: only one is ErrFieldType", body, gotErr, wantErr)
		}
		var gotNN, wantNN *NoNameError
		if errors.As(gotErr, &gotNN) != errors.As(wantErr, &wantNN) {
			t.Fatalf("FromEvent(%q) error = %v, reference error = %v: only one is a *NoNameError", body, gotErr, wantErr)
		}
		if gotNN != nil && !slices.Equal(gotNN.Fields, wantNN.Fields) {
			t.Fatalf("FromEvent(%q) NoNameError.Fields = %q, reference = %q", body, gotNN.Fields, wantNN.Fields)
		}
	})
}
