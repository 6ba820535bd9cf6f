package geminifake

// batches.create as the Gemini API serves it to the SDK's Batches.Create
// (google.golang.org/genai v1.79.1, batches.go: create,
// createBatchJobParametersToMldev, batchJobSourceToMldev,
// createBatchJobConfigToMldev):
//
//	POST /v1beta/{model}:batchGenerateContent
//	{"batch":{"displayName":…,
//	          "inputConfig":{"fileName":"files/…"} | {"requests":{"requests":[{"request":{…},"metadata":{…}}]}},
//	          "webhookConfig":{"uris":[…],"userMetadata":{…}}}}
//
// and POST /v1beta/{model}:asyncBatchEmbedContent (Batches.CreateEmbeddings:
// an embedding batch, metadata @type EmbedContentBatch, same body shape),
// answered with the new batch's long-running operation (PENDING), which the
// SDK reads with batchJobFromMldev. The fake only records the batch; what
// happens to it next is the caller's (SetCreateHook: the emulator schedules
// it to finish).

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// MaxCreateBody bounds a batches.create request (the API's inline limit is
// 20 MB of requests).
const MaxCreateBody = 20 << 20

// CreateRequest is what a batches.create call asked for.
type CreateRequest struct {
	// Model is the model of the URL, "models/…" (or "tunedModels/…").
	Model       string
	DisplayName string
	// FileName is the input file of a file source ("files/…"); "" for an
	// inline source.
	FileName string
	// Requests are the inlined requests of an inline source, in order.
	Requests []InlinedRequest
	// WebhookConfig is the per-job webhook configuration, if any.
	WebhookConfig *WebhookConfig
}

// InlinedRequest is one inlined request of a batches.create call.
type InlinedRequest struct {
	// Request is the GenerateContentRequest as sent ({"model","contents",…}).
	Request json.RawMessage
	// Metadata is the request's metadata, returned with its response.
	Metadata map[string]string
}

// createState is what create.go keeps on a Server (under Server.mu).
type createState struct {
	hook func(Batch, CreateRequest)
}

// SetCreateHook installs a function called (outside the server's lock) with
// every batch a batches.create call added, after it is added and before
// the answer is written; nil removes it. Without a hook a created batch
// stays PENDING until the caller changes it.
func (s *Server) SetCreateHook(h func(Batch, CreateRequest)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creates.hook = h
}

// HasFile reports whether the fake holds a file added with AddFile.
func (s *Server) HasFile(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.extra.files[name]
	return ok
}

// createBody is the request body, in the SDK's JSON names. Unknown fields
// are refused, as the API does.
type createBody struct {
	Batch *struct {
		DisplayName string `json:"displayName"`
		Model       string `json:"model"`
		InputConfig *struct {
			FileName      string `json:"fileName"`
			EmbedFileName string `json:"file_name"` // the SDK's spelling for an embedding batch
			Requests      *struct {
				Requests []struct {
					Request  json.RawMessage   `json:"request"`
					Metadata map[string]string `json:"metadata"`
				} `json:"requests"`
			} `json:"requests"`
		} `json:"inputConfig"`
		WebhookConfig *WebhookConfig `json:"webhookConfig"`
	} `json:"batch"`
}

// serveCreate answers POST /v1beta/{model}:batchGenerateContent; false if
// the path is not that.
func (s *Server) serveCreate(w http.ResponseWriter, r *http.Request) bool {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1beta/")
	if !ok {
		return false
	}
	model, ok := strings.CutSuffix(rest, ":batchGenerateContent")
	typ := ""
	if !ok {
		if model, ok = strings.CutSuffix(rest, ":asyncBatchEmbedContent"); !ok {
			return false
		}
		typ = "EmbedContentBatch"
	}
	if r.Method != http.MethodPost {
		writeError(w, http.StatusMethodNotAllowed, "batchGenerateContent: want POST")
		return true
	}
	if !s.checkKey(w, r, false) {
		return true
	}
	if !validModel(model) {
		writeError(w, http.StatusNotFound, "models/"+strings.TrimPrefix(model, "models/")+" is not found for API version v1beta, or is not supported for batchGenerateContent.")
		return true
	}
	req, err := parseCreate(r, model)
	if err != nil {
		writeResult(w, err, nil)
		return true
	}
	now := s.opts.Now().UTC()
	b := Batch{
		Name: GeminiName(newID(10)), State: "BATCH_STATE_PENDING", DisplayName: req.DisplayName, Model: model,
		CreateTime: now, UpdateTime: now, RequestCount: int64(len(req.Requests)),
		WebhookConfig: req.WebhookConfig.Clone(), Type: typ,
	}
	s.Add(b)
	s.mu.Lock()
	hook := s.creates.hook
	s.mu.Unlock()
	if hook != nil {
		hook(b, req)
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(s.renderGemini(b))
	return true
}

// validModel accepts "models/<id>" and "tunedModels/<id>" with one segment.
func validModel(m string) bool {
	for _, p := range []string{"models/", "tunedModels/"} {
		if id, ok := strings.CutPrefix(m, p); ok {
			return id != "" && !strings.Contains(id, "/")
		}
	}
	return false
}

func parseCreate(r *http.Request, model string) (CreateRequest, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxCreateBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return CreateRequest{}, badRequest("Request payload size exceeds the limit: %d bytes.", MaxCreateBody)
		}
		return CreateRequest{}, badRequest("Invalid JSON payload received: %v", err)
	}
	var in createBody
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return CreateRequest{}, badRequest("Invalid JSON payload received. %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if in.Batch == nil {
		return CreateRequest{}, badRequest("batch is required.")
	}
	b := in.Batch
	if b.Model != "" && b.Model != model {
		return CreateRequest{}, badRequest("batch.model %q does not match the model of the URL, %q.", b.Model, model)
	}
	out := CreateRequest{Model: model, DisplayName: b.DisplayName, WebhookConfig: b.WebhookConfig.Clone()}
	ic := b.InputConfig
	if ic != nil {
		ic.FileName = cmp.Or(ic.FileName, ic.EmbedFileName)
	}
	hasFile := ic != nil && ic.FileName != ""
	hasRequests := ic != nil && ic.Requests != nil
	if hasFile == hasRequests {
		return CreateRequest{}, badRequest("batch.input_config must set exactly one of file_name or requests.")
	}
	if hasFile {
		id, ok := strings.CutPrefix(ic.FileName, "files/")
		if !ok || id == "" || strings.Contains(id, "/") {
			return CreateRequest{}, badRequest("batch.input_config.file_name %q is not a file name (files/…).", ic.FileName)
		}
		out.FileName = ic.FileName
	} else {
		if len(ic.Requests.Requests) == 0 {
			return CreateRequest{}, badRequest("batch.input_config.requests.requests must hold at least one request.")
		}
		for i, q := range ic.Requests.Requests {
			var obj map[string]json.RawMessage
			if json.Unmarshal(q.Request, &obj) != nil || obj == nil {
				return CreateRequest{}, badRequest("batch.input_config.requests.requests[%d].request must be an object.", i)
			}
			out.Requests = append(out.Requests, InlinedRequest{Request: q.Request, Metadata: q.Metadata})
		}
	}
	if err := CheckWebhookConfig(out.WebhookConfig); err != nil {
		return CreateRequest{}, err
	}
	return out, nil
}
