package emulator

// Results of succeeded batches: a responses file a user can read (one JSONL
// line per request, each with its key) and inlined responses for batches
// created with an inline source, in the shapes docs/gemini-api.md
// ("Results of a batch") describes.

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Responses is the content of a succeeded batch's responses file: one line
// per request (RequestCount, at least one), keyed "request-1", "request-2",
// …; the last FailedCount lines carry an error instead of a response. It is
// the same for the same name, model and counts, so a test can compare a
// download with it byte for byte.
func Responses(b geminifake.Batch) []byte {
	n := max(b.RequestCount, 1)
	failed := min(max(b.FailedCount, 0), n)
	model := modelVersion(b.Model)
	var out []byte
	for i := int64(1); i <= n; i++ {
		var line any
		key := fmt.Sprintf("request-%d", i)
		if i > n-failed {
			line = struct {
				Key   string            `json:"key"`
				Error geminifake.Status `json:"error"`
			}{key, geminifake.Status{Code: 400, Message: "Request " + key + " could not be processed (emulated failure)."}}
		} else {
			line = struct {
				Key      string          `json:"key"`
				Response json.RawMessage `json:"response"`
			}{key, response(fmt.Sprintf("Emulated response %d of %d for %s.", i, n, b.Name), model)}
		}
		raw, err := json.Marshal(line)
		if err != nil {
			panic("emulator: marshalling a response line: " + err.Error()) // plain structs always marshal
		}
		out = append(append(out, raw...), '\n')
	}
	return out
}

// InlinedResponses are the inlined responses of a batch created with these
// inline requests: one per request, in order, with the request's metadata
// and a text that quotes the start of its prompt.
func InlinedResponses(b geminifake.Batch, reqs []geminifake.InlinedRequest) []json.RawMessage {
	model := modelVersion(b.Model)
	out := make([]json.RawMessage, 0, len(reqs))
	for i, r := range reqs {
		text := fmt.Sprintf("Emulated response %d of %d for %s", i+1, len(reqs), b.Name)
		if p := promptText(r.Request); p != "" {
			text += ", to: " + p
		}
		raw, err := json.Marshal(struct {
			Response json.RawMessage   `json:"response"`
			Metadata map[string]string `json:"metadata,omitempty"`
		}{response(text, model), r.Metadata})
		if err != nil {
			panic("emulator: marshalling an inlined response: " + err.Error())
		}
		out = append(out, raw)
	}
	return out
}

// response is a GenerateContentResponse with one candidate saying text.
func response(text, model string) json.RawMessage {
	type part struct {
		Text string `json:"text"`
	}
	type content struct {
		Parts []part `json:"parts"`
		Role  string `json:"role"`
	}
	type candidate struct {
		Content      content `json:"content"`
		FinishReason string  `json:"finishReason"`
		Index        int     `json:"index"`
	}
	words := int64(len(strings.Fields(text)))
	raw, err := json.Marshal(struct {
		Candidates    []candidate    `json:"candidates"`
		UsageMetadata map[string]any `json:"usageMetadata"`
		ModelVersion  string         `json:"modelVersion"`
	}{
		[]candidate{{Content: content{Parts: []part{{text}}, Role: "model"}, FinishReason: "STOP"}},
		map[string]any{"promptTokenCount": 8, "candidatesTokenCount": words, "totalTokenCount": 8 + words},
		model,
	})
	if err != nil {
		panic("emulator: marshalling a response: " + err.Error())
	}
	return raw
}

func modelVersion(m string) string {
	if m = strings.TrimPrefix(m, "models/"); m == "" {
		return "gemini-2.5-flash"
	}
	return m
}

// promptText is the text of a request's contents, the first 60 characters.
func promptText(req json.RawMessage) string {
	var r struct {
		Contents []struct {
			Parts []struct {
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"contents"`
	}
	if json.Unmarshal(req, &r) != nil {
		return ""
	}
	var texts []string
	for _, c := range r.Contents {
		for _, p := range c.Parts {
			if p.Text != "" {
				texts = append(texts, p.Text)
			}
		}
	}
	s := strings.Join(strings.Fields(strings.Join(texts, " ")), " ")
	if utf8.RuneCountInString(s) > 60 {
		s = string([]rune(s)[:60]) + "…"
	}
	return s
}
