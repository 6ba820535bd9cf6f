package canon

import (
	"bytes"
	"encoding/json"
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
