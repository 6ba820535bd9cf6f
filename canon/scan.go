package canon

import (
	"bytes"
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"
)

// view holds the raw values of the fields of one JSON object that canon
// reads. Values are slices of a document json.Valid has accepted, so reading
// an object costs one pass and no allocation. A repeated field keeps its last
// value, as encoding/json does.
type view struct {
	name, operation, operationName, resourceName  json.RawMessage
	id, typ, data, message, state, metadata, done json.RawMessage

	isObject bool // the value read was an object
}

// numCandidates is how many name candidate fields there are (spec §2).
const numCandidates = 4

// candidate returns the i-th name candidate field, in spec §2 order.
func (v *view) candidate(i int) (string, json.RawMessage) {
	switch i {
	case 0:
		return "name", v.name
	case 1:
		return "operation", v.operation
	case 2:
		return "operationName", v.operationName
	default:
		return "resourceName", v.resourceName
	}
}

// readObject reads the fields canon needs from raw, which must be valid JSON.
// A value that is not an object gives a view whose isObject is false.
func readObject(raw json.RawMessage) view {
	var v view
	if len(raw) == 0 || raw[0] != '{' {
		return v
	}
	v.isObject = true
	it := fieldIter{b: raw, i: 1}
	for {
		key, val, ok := it.next()
		if !ok {
			return v
		}
		k := key[1 : len(key)-1]
		if bytes.IndexByte(k, '\\') >= 0 {
			k = []byte(str(key)) // an escaped key ("n\u0061me") is rare
		}
		switch string(k) {
		case "name":
			v.name = val
		case "operation":
			v.operation = val
		case "operationName":
			v.operationName = val
		case "resourceName":
			v.resourceName = val
		case "id":
			v.id = val
		case "type":
			v.typ = val
		case "data":
			v.data = val
		case "message":
			v.message = val
		case "state":
			v.state = val
		case "metadata":
			v.metadata = val
		case "done":
			v.done = val
		}
	}
}

// eachField calls fn with every field of the valid JSON object raw: the key
// as a quoted JSON string and the raw value.
func eachField(raw json.RawMessage, fn func(key, val json.RawMessage)) {
	it := fieldIter{b: raw, i: 1}
	for {
		key, val, ok := it.next()
		if !ok {
			return
		}
		fn(key, val)
	}
}

// fieldIter walks the fields of a valid JSON object, starting after its '{'.
type fieldIter struct {
	b []byte
	i int
}

// next returns the next field's quoted key and raw value; ok is false at the
// end of the object.
func (it *fieldIter) next() (key, val json.RawMessage, ok bool) {
	b := it.b
	i := skipSpace(b, it.i)
	if i < len(b) && b[i] == ',' {
		i = skipSpace(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		it.i = len(b)
		return nil, nil, false
	}
	end := skipString(b, i)
	key = b[i:end]
	i = skipSpace(b, end)
	if i >= len(b) || b[i] != ':' {
		it.i = len(b)
		return nil, nil, false
	}
	i = skipSpace(b, i+1)
	end = skipValue(b, i)
	val = b[i:end]
	it.i = end
	return key, val, len(key) >= 2 && len(val) > 0
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// skipString returns the index just after the JSON string that starts at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); {
		switch b[i] {
		case '\\':
			i += 2
		case '"':
			return i + 1
		default:
			i++
		}
	}
	return len(b)
}

// skipValue returns the index just after the JSON value that starts at i.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}

// StrictString decodes the JSON string raw as a name must be read (spec
// §12): ok is false when it is not valid UTF-8 or holds an unpaired
// surrogate escape such as \ud800, both of which encoding/json would
// silently replace with U+FFFD, so that two different names would become
// one key. A value that is not a string (absent, null, a number) decodes to
// "", ok. raw must be a JSON value that json.Valid accepts.
func StrictString(raw json.RawMessage) (s string, ok bool) { return strictStr(raw) }

// strictStr decodes the JSON string raw (a token json.Valid has accepted)
// and reports ok false when it holds invalid UTF-8 or an unpaired surrogate
// escape such as \ud800, which encoding/json would both replace with U+FFFD
// (spec §12). Absent and null values decode to "", ok. A string without
// escapes is returned as a substring of raw's bytes, copied once.
func strictStr(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", true
	}
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') < 0 {
		if !utf8.Valid(s) {
			return "", false
		}
		return string(s), true
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			if c < utf8.RuneSelf {
				b = append(b, c)
				i++
				continue
			}
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			b = append(b, s[i:i+size]...)
			i += size
			continue
		}
		if i+1 >= len(s) {
			return "", false
		}
		switch e := s[i+1]; e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := hex4(s[i+2:])
			if !ok {
				return "", false
			}
			i += 6
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed at once by an escaped low
				// one is a character.
				lo, ok := rune(-1), false
				if r < 0xdc00 && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
					lo, ok = hex4(s[i+2:])
				}
				if !ok || lo < 0xdc00 || lo > 0xdfff {
					return "", false
				}
				r = utf16.DecodeRune(r, lo)
				i += 6
			}
			b = utf8.AppendRune(b, r)
			continue
		default:
			return "", false
		}
		i += 2
	}
	return string(b), true
}

// hex4 reads the four hex digits that start s.
func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
