package canon

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Classes of FromEvent's errors, matched with errors.Is. Besides these,
// FromEvent returns a *NoNameError when no name candidate is present, and
// wraps ErrInvalidKey when the name is one spec §12 refuses.
var (
	// ErrNotObject: the document is valid JSON but not an object (an array,
	// a string, a number, …).
	ErrNotObject = errors.New("event is not a JSON object")
	// ErrNotJSON: the document is empty or not valid JSON.
	ErrNotJSON = errors.New("event is not JSON")
	// ErrEnvelope: a Pub/Sub push envelope whose message.data is not a
	// non-empty base64 string, or envelopes nested too deep.
	ErrEnvelope = errors.New("bad Pub/Sub envelope")
	// ErrFieldType: a name candidate of the wrong JSON type (a number, an
	// array, an object whose "name" is not a string).
	ErrFieldType = errors.New("name candidate of the wrong JSON type")
)

// classError is an error of one of the classes above whose text is written
// out in full (the class's own text would only repeat it).
type classError struct {
	class error
	msg   string
}

func (e *classError) Error() string        { return e.msg }
func (e *classError) Is(target error) bool { return target == e.class }

func classed(class error, format string, a ...any) error {
	return &classError{class: class, msg: fmt.Sprintf(format, a...)}
}

// maxPubSubDepth bounds how many Pub/Sub envelopes FromEvent unwraps, so that
// a hostile body cannot make it recurse without end.
const maxPubSubDepth = 2

// FromEvent reads the operation an event document names (spec §2): it unwraps
// a Pub/Sub push envelope (message.data, base64 JSON) and a webhook's data
// envelope, takes the first non-empty name candidate, and says whether the
// event announces a completion (spec §6). A document without a candidate gives
// a *NoNameError; the other errors are of the classes ErrNotJSON,
// ErrNotObject, ErrEnvelope, ErrFieldType and ErrInvalidKey (spec §12: the
// name is checked in the raw bytes, so invalid UTF-8 and unpaired surrogate
// escapes are refused, not replaced, and then by CheckKey). On error the
// Event holds only Type and HasType. Event.Operation never aliases body.
func FromEvent(body []byte) (Event, error) {
	ev, err := fromDoc(body, 0)
	if err != nil {
		typed := Event{Type: ev.Type, HasType: ev.HasType}
		if nn, ok := err.(*NoNameError); ok {
			return typed, nn // its message is already complete
		}
		return typed, fmt.Errorf("canon: %w", err)
	}
	return ev, nil
}

// fromDoc does FromEvent's work at one envelope depth. Its errors do not
// carry the "canon: " prefix; FromEvent adds it once. With an error, the
// Event returned holds Type and HasType once they are known.
func fromDoc(body []byte, depth int) (Event, error) {
	raw := bytes.TrimSpace(body)
	if len(raw) == 0 {
		return Event{}, classed(ErrNotJSON, "empty event body")
	}
	if !json.Valid(raw) {
		// Unmarshal says where: json.Valid does not.
		return Event{}, classed(ErrNotJSON, "parsing event: %v", json.Unmarshal(raw, new(any)))
	}
	if raw[0] != '{' {
		return Event{}, fmt.Errorf("%w: got %s", ErrNotObject, kind(raw))
	}
	top := asObject(raw)

	if data, ok, err := pubSubData(top); err != nil {
		return Event{}, err
	} else if ok {
		if depth >= maxPubSubDepth {
			return Event{}, classed(ErrEnvelope, "Pub/Sub envelopes nested more than %d deep", maxPubSubDepth)
		}
		ev, err := fromDoc(data, depth+1)
		if nn, ok := err.(*NoNameError); ok {
			nn.Within = "Pub/Sub message.data"
			return ev, nn
		}
		if err != nil {
			return ev, fmt.Errorf("Pub/Sub message.data: %w", err)
		}
		return ev, nil
	}

	typ := top["type"]
	ev := Event{Type: str(typ), HasType: len(typ) > 0 && typ[0] != 'n'}
	data := asObject(top["data"])
	batch := IsBatchType(ev.Type)

	name, from, err := findName(top, data)
	if err != nil {
		return ev, err
	}
	if name == "" {
		return ev, &NoNameError{Fields: fieldNames(top, data)}
	}
	if collectionOnly(name) {
		// Checked before a batch event's bare id gets its collection, so
		// that "batches/" does not become the batch named "batches".
		return ev, fmt.Errorf("%w: %s names a collection, not an operation", ErrInvalidKey, Quote(name))
	}
	if batch && !strings.Contains(name, "/") {
		name = "batches/" + name // the Gemini webhook names a batch by its bare id
	}
	ev.Key = Prefix + name
	if err := checkBytes(ev.Key); err != nil {
		return ev, err
	}
	ev.Name = name

	// The state is the first one found in "state" or "metadata.state" (at
	// the top, in data, in the candidate object). Any non-terminal signal,
	// "done": false included, wins: accepting a running batch as done would
	// run the effect on partial results, while ignoring an event loses
	// nothing (the poller sees the completion again).
	nonTerminal := batch && !IsCompletionType(ev.Type)
	for _, obj := range []object{top, data, from} {
		for _, st := range []json.RawMessage{obj["state"], asObject(obj["metadata"])["state"]} {
			if st := NormalizeState(str(st)); st != "" {
				ev.State = cmp.Or(ev.State, st)
				nonTerminal = nonTerminal || !IsTerminal(st)
			}
		}
		nonTerminal = nonTerminal || string(obj["done"]) == "false"
	}
	ev.State = cmp.Or(ev.State, StateFromType(ev.Type))
	ev.Terminal = !nonTerminal
	ev.Operation = bytes.Clone(raw) // body may be a reused buffer
	return ev, nil
}

// candidates are the fields that may hold the operation name, in the order
// of spec §2.
var candidates = [...]string{"name", "operation", "operationName", "resourceName"}

// object is a JSON object's fields, their values still raw. A repeated
// field keeps its last value, as encoding/json does.
type object = map[string]json.RawMessage

// asObject decodes raw (valid JSON) when it is an object, and is nil
// otherwise.
func asObject(raw json.RawMessage) object {
	var obj object
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	return obj
}

// findName returns the canonical name of the first non-empty candidate, top
// level first, then inside data (where the webhook's id also counts), and the
// object that held it when the candidate was an object.
func findName(top, data object) (string, object, error) {
	for _, in := range []struct {
		prefix string // the field's label in errors
		obj    object // a nil data holds none
	}{{"", top}, {"data.", data}} {
		for _, f := range candidates {
			if n, obj, err := candidate(in.prefix+f, in.obj[f]); err != nil || n != "" {
				return n, obj, err
			}
		}
	}
	return candidate("data.id", data["id"])
}

// candidate reads one name candidate: a string, or an object whose own
// "name" is a string. Absent, null, blank and name-less values are empty.
// A string that is not valid UTF-8 or holds an unpaired surrogate escape is
// refused (spec §12), not decoded with replacement characters: two different
// names must never become one key.
func candidate(field string, raw json.RawMessage) (string, object, error) {
	obj := asObject(raw)
	if obj != nil {
		field, raw = field+".name", obj["name"]
		if len(raw) > 0 && raw[0] != '"' && raw[0] != 'n' {
			return "", nil, classed(ErrFieldType, "field %q is %s, want a string", field, kind(raw))
		}
	}
	switch {
	case len(raw) == 0 || raw[0] == 'n':
		return "", obj, nil
	case raw[0] != '"':
		return "", nil, classed(ErrFieldType, "field %q is %s, want a string or an object with a name", field, kind(raw))
	}
	s, ok := StrictString(raw)
	if !ok {
		return "", nil, fmt.Errorf("%w: field %q is not valid UTF-8 or holds an unpaired surrogate escape: %s",
			ErrInvalidKey, field, Quote(string(raw[1:len(raw)-1])))
	}
	return canonName(s), obj, nil
}

// pubSubData returns the decoded message.data of a Pub/Sub push envelope
// ({"message":{"data":"<base64>",…},"subscription":…}); ok is false when top
// is not one.
func pubSubData(top object) (data []byte, ok bool, err error) {
	raw := asObject(top["message"])["data"]
	if raw == nil {
		return nil, false, nil
	}
	if raw[0] != '"' {
		return nil, false, classed(ErrEnvelope, "Pub/Sub message.data is %s, want a base64 string", kind(raw))
	}
	enc := strings.TrimRight(str(raw), "=")
	if enc == "" {
		return nil, false, classed(ErrEnvelope, "Pub/Sub message.data is empty")
	}
	codec := base64.RawStdEncoding
	if strings.ContainsAny(enc, "-_") {
		codec = base64.RawURLEncoding
	}
	data, err = codec.DecodeString(enc)
	if err != nil {
		return nil, false, classed(ErrEnvelope, "Pub/Sub message.data is not base64: %v", err)
	}
	return data, true, nil
}

// fieldNames lists the field names of top and those of data as "data.x",
// sorted. Only the error path calls it.
func fieldNames(top, data object) []string {
	names := slices.Collect(maps.Keys(top))
	for k := range data {
		names = append(names, "data."+k)
	}
	slices.Sort(names)
	return slices.Compact(names) // a top-level "data.x" and data's x are one name
}

// str returns raw's value when it is a JSON string, and "" otherwise. Invalid
// UTF-8 and unpaired surrogates become U+FFFD, as in encoding/json: right
// for a state or a type (an unknown state counts as non-terminal), wrong for
// a name (StrictString).
func str(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' {
		_ = json.Unmarshal(raw, &s)
	}
	return s
}

// StrictString decodes the JSON string raw as a name must be read (spec
// §12): ok is false when it is not valid UTF-8 or holds an unpaired
// surrogate escape such as \ud800, both of which encoding/json would
// silently replace with U+FFFD, so that two different names would become
// one key. A value that is not a string (absent, null, a number) decodes to
// "", ok. raw must be a JSON value that json.Valid accepts.
func StrictString(raw json.RawMessage) (s string, ok bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", true
	}
	if !utf8.Valid(raw) || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i++; raw[i] != 'u' {
			continue // an escaped byte: an escaped backslash is passed whole
		}
		// Only a high surrogate directly followed by an escaped low one is
		// a character; json.Valid promised four hex digits after each \u.
		hi := surrogate(raw[i+1 : i+5])
		i += 4
		if hi == 0 {
			continue
		}
		if hi >= 0xdc00 || !bytes.HasPrefix(raw[i+1:], []byte(`\u`)) || surrogate(raw[i+3:i+7]) < 0xdc00 {
			return "", false
		}
		i += 6
	}
	return s, true
}

// surrogate returns the UTF-16 code unit written by four hex digits when it
// is a surrogate, else 0.
func surrogate(hex []byte) rune {
	v, _ := strconv.ParseUint(string(hex), 16, 16)
	if v < 0xd800 || v > 0xdfff {
		return 0
	}
	return rune(v)
}

// kind names the JSON type of raw for error messages.
func kind(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "missing"
	}
	if i := strings.IndexByte(`{["tfn`, raw[0]); i >= 0 {
		return [...]string{"an object", "an array", "a string", "a boolean", "a boolean", "null"}[i]
	}
	return "a number"
}
