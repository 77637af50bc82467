package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

// fuzzQueues records the enqueues the handler passes on; nothing else is
// used by the enqueue endpoint.
type fuzzQueues struct {
	mu       sync.Mutex
	enqueued []rm.EnqueueParams
	payloads [][]byte
}

const fuzzMaxPayload = 1024

func (q *fuzzQueues) Enqueue(_ context.Context, p rm.EnqueueParams) (*fsm.MessageInfo, error) {
	payload, err := io.ReadAll(p.Payload)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.enqueued = append(q.enqueued, p)
	q.payloads = append(q.payloads, payload)
	return &fsm.MessageInfo{Namespace: "default", Queue: p.Queue, ID: "m1", Bytes: int64(len(payload)), Visibility: 30_000}, nil
}

func (q *fuzzQueues) Dequeue(context.Context, rm.DequeueParams) (*rm.Delivery, error) {
	return nil, errcode.QueueEmpty
}
func (q *fuzzQueues) Ack(context.Context, rm.MessageRef) error { return errcode.QueueMessageNotFound }
func (q *fuzzQueues) Nack(context.Context, rm.MessageRef, rm.NackParams) (*fsm.QueueResult, error) {
	return nil, errcode.QueueMessageNotFound
}
func (q *fuzzQueues) Extend(context.Context, rm.MessageRef, int64) (*fsm.MessageInfo, error) {
	return nil, errcode.QueueMessageNotFound
}
func (q *fuzzQueues) Stats(context.Context, string, string, rm.Consistency) (fsm.QueueStats, error) {
	return fsm.QueueStats{}, nil
}
func (q *fuzzQueues) WatchDelivery(context.Context, string, string, string, string) (<-chan fsm.Event, func(), error) {
	ended := make(chan fsm.Event, 1)
	ended <- fsm.Event{Kind: fsm.EventDeliveryEnded}
	return ended, func() {}, nil
}
func (q *fuzzQueues) Delivering(context.Context, string, string, string, string) (bool, error) {
	return false, nil
}

func (q *fuzzQueues) Limits() rm.QueueLimits {
	return rm.QueueLimits{MaxPayloadBytes: fuzzMaxPayload, MaxVisibility: time.Hour, MaxWait: time.Second}
}

// panicLog fails the fuzz input when the handler logged a contained panic.
type panicLog struct {
	slog.Handler
	mu     sync.Mutex
	panics []string
}

func (l *panicLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "handler panic" {
		l.mu.Lock()
		l.panics = append(l.panics, r.Message)
		l.mu.Unlock()
	}
	return nil
}

func newFuzzHandler() (http.Handler, *fuzzQueues, *panicLog) {
	q := &fuzzQueues{}
	log := &panicLog{Handler: slog.NewTextHandler(io.Discard, nil)}
	return New(Options{NodeID: "fuzz", Queues: q, Logger: slog.New(log), MaxBodyBytes: 2048}), q, log
}

// checkEnvelope checks that a 4xx answer is a JSON error envelope whose code
// maps to the status answered.
func checkEnvelope(t *testing.T, rec *httptest.ResponseRecorder) *errcode.Error {
	t.Helper()
	if rec.Code < 400 || rec.Code >= 500 {
		t.Fatalf("status %d, want 2xx or 4xx (body %q)", rec.Code, rec.Body.Bytes())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("status %d with content type %q", rec.Code, ct)
	}
	var e errcode.Error
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
		t.Fatalf("status %d without an error envelope: %q", rec.Code, rec.Body.Bytes())
	}
	if StatusOf(e.Code) != rec.Code {
		t.Fatalf("code %s answered with %d, the table says %d", e.Code, rec.Code, StatusOf(e.Code))
	}
	return &e
}

func multipartSeed(t testing.TB, boundary string, parts ...[3]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if boundary != "" {
		if err := mw.SetBoundary(boundary); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range parts {
		h := textproto.MIMEHeader{"Content-Disposition": {`form-data; name="` + p[0] + `"`}}
		if p[1] != "" {
			h.Set("Content-Type", p[1])
		}
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(w, p[2])
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.Bytes()
}

// FuzzEnqueueMultipart drives the enqueue endpoint (the multipart parser
// behind it) with arbitrary content types and bodies: nothing panics, a
// rejection is a 4xx envelope and reaches no service, an acceptance (of a
// body with its closing delimiter) passes exactly one enqueue with a payload
// within the limit and meta fields that were valid JSON.
func FuzzEnqueueMultipart(f *testing.F) {
	meta := [3]string{"meta", "application/json", `{"queue":"q","attributes":{"a":1},"max_attempts":2}`}
	for _, seed := range [][][3]string{
		{meta, {"payload", "text/plain", "hello"}},
		{meta},
		{{"payload", "", "payload first"}, meta},
		{meta, {"other", "application/octet-stream", "first non-meta part is the payload"}},
		{meta, meta},
		{meta, {"payload", "", "a"}, {"payload", "", "b"}},
		{{"meta", "", `{"queue":"q","unknown":1}`}},
		{{"meta", "", `{"queue":"q"} {"queue":"r"}`}},
		{meta, {"payload", "", strings.Repeat("x", fuzzMaxPayload+1)}},
		{{"meta", "", strings.Repeat(" ", 3000) + "{}"}},
	} {
		ct, body := multipartSeed(f, "", seed...)
		f.Add(ct, body)
	}
	ct, body := multipartSeed(f, strings.Repeat("b", 70), meta, [3]string{"payload", "", "long boundary"})
	f.Add(ct, body)
	f.Add(`multipart/related; boundary="`+strings.Repeat("b", 5000)+`"`, body)
	f.Add("multipart/form-data; boundary=x", []byte("--x\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{}"))
	f.Add("multipart/form-data; boundary=x", []byte("--x\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"queue\":\"q\"}\r\n--x\r\n"))
	f.Add("multipart/form-data; boundary=x", []byte("--x\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"queue\":\"q\"}\r\n--x--"))
	f.Add("text/plain", []byte("not multipart"))
	f.Add("multipart/form-data", []byte("--x--\r\n"))
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		h, q, log := newFuzzHandler()
		req := httptest.NewRequest(http.MethodPost, "/v1/queue/enqueue", bytes.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if len(log.panics) > 0 {
			t.Fatalf("handler panicked: %v", log.panics)
		}
		if rec.Code != http.StatusOK {
			checkEnvelope(t, rec)
			if len(q.enqueued) != 0 {
				t.Fatalf("rejected with %d after enqueueing", rec.Code)
			}
			return
		}
		if len(q.enqueued) != 1 {
			t.Fatalf("accepted after %d enqueues", len(q.enqueued))
		}
		if _, params, _ := mime.ParseMediaType(contentType); !bytes.Contains(body, []byte("--"+params["boundary"]+"--")) {
			t.Fatalf("accepted a body without its closing delimiter")
		}
		if n := len(q.payloads[0]); n > fuzzMaxPayload {
			t.Fatalf("accepted a payload of %d bytes, limit %d", n, fuzzMaxPayload)
		}
		if a := q.enqueued[0].Attributes; a != nil && !json.Valid(a) {
			t.Fatalf("attributes %q are not JSON", a)
		}
	})
}

// An escaped half of a UTF-16 surrogate pair on its own is found wherever
// it is; a whole pair, an escaped backslash before a "u" and other escapes
// are not lone surrogates.
func TestLoneSurrogate(t *testing.T) {
	for in, want := range map[string]bool{
		`{"k":"a"}`:                  false,
		`{"k":"\ud83d\ude00"}`:       false,
		`"\uD83D\uDE00"`:             false,
		`{"k":"\\ud800"}`:            false,
		`{"k":"\u00e9\n\t"}`:         false,
		`"\u12"`:                     false,
		`{"k":"\ud800"}`:             true,
		`{"k":"\udc00"}`:             true,
		`{"k":"\ud83d\ud83d\ude00"}`: true,
		`{"k":"\ud83d\n"}`:           true,
		`{"k":"\\\ud800"}`:           true,
		`"\ud800x"`:                  true,
		`"\ud83d\ude00x\ud800`:       true,
	} {
		if got := loneSurrogate([]byte(in)); got != want {
			t.Errorf("%s: %v, want %v", in, got, want)
		}
	}
}

// FuzzDecodeJSON decodes arbitrary bodies as every JSON request of the API:
// nothing panics, a rejection is invalid_body (400) or request_too_large
// (413), and an accepted body decodes to a value that encodes and decodes
// back to itself.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{"", "{}", "null", "[]", `{"key":"k","owner":"o","ttl_seconds":30,"block_seconds":-1}`,
		`{"key":"k"} {}`, `{"key":"k"}x`, `{"key":"k"}}`, `{"unknown":1}`, `{"ttl_seconds":1e400}`, `{"key":"\ud800"}`,
		`{"participants":[{"namespace":"n","key":"k","backend_hash":"h"}],"state":"commit","expires_at_unix":-1}`,
		`{"last_error":{"a":[1,2,{"b":null}]},"intent":"defer"}`, `{"attributes":"x"}`, `{"wait_seconds":-2}`,
		strings.Repeat("[", 3000), `{"key":"` + strings.Repeat("k", 3000) + `"}`, "\xef\xbb\xbf{}"} {
		f.Add([]byte(s))
	}
	types := []any{wire.AcquireRequest{}, wire.KeepAliveRequest{}, wire.ReleaseRequest{}, wire.DequeueRequest{},
		wire.AckRequest{}, wire.NackRequest{}, wire.ExtendRequest{}, wire.QueueStatsRequest{}, wire.TxnDecisionRequest{},
		wire.TxnReplayRequest{}, wire.TCRMRegisterRequest{}, wire.RemovePeerRequest{}, wire.TCClusterAnnounceRequest{},
		wire.TCClusterLeaveRequest{}, wire.RevokeRequest{}, wire.TrustRequest{}, struct{}{}}
	h := &handler{Options: Options{MaxBodyBytes: 2048}}
	decode := func(body []byte, v any) error {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		return h.decodeJSON(httptest.NewRecorder(), req, v)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, typ := range types {
			v := reflect.New(reflect.TypeOf(typ))
			err := decode(body, v.Interface())
			if err != nil {
				var e *errcode.Error
				if !errors.As(err, &e) || (e.Code != errcode.InvalidBody.Code && e.Code != errcode.RequestTooLarge.Code) {
					t.Fatalf("%T: %v", typ, err)
				}
				if e.Code == errcode.RequestTooLarge.Code && int64(len(body)) <= h.MaxBodyBytes {
					t.Fatalf("%T: %d bytes is not too large", typ, len(body))
				}
				continue
			}
			if len(bytes.TrimSpace(body)) > 0 && !json.Valid(body) {
				t.Fatalf("%T: accepted %q, which is not JSON", typ, body)
			}
			raw, err := json.Marshal(v.Interface())
			if err != nil {
				t.Fatalf("%T: decoded value does not encode: %v", typ, err)
			}
			again := reflect.New(reflect.TypeOf(typ))
			if err := json.Unmarshal(raw, again.Interface()); err != nil {
				t.Fatalf("%T: %s does not decode: %v", typ, raw, err)
			}
			if raw2, _ := json.Marshal(again.Interface()); !bytes.Equal(raw, raw2) {
				t.Fatalf("%T: %s decodes as %s", typ, raw, raw2)
			}
		}
		if err := decodeStrict(body, &wire.EnqueueRequest{}, "meta part"); err != nil && !errors.Is(err, errcode.InvalidBody) {
			t.Fatalf("meta part: %v", err)
		}
	})
}

// badRequest checks that err is a coded rejection answered with a 4xx.
func badRequest(t *testing.T, what string, err error) {
	t.Helper()
	var e *errcode.Error
	if !errors.As(err, &e) || StatusOf(e.Code)/100 != 4 {
		t.Fatalf("%s: %v is not a 4xx rejection", what, err)
	}
}

// FuzzRequestHeaders parses the headers and parameters requests carry
// outside their bodies: X-Fencing-Token, X-If-Version, X-Raftlockd-Timeout,
// meta_etag, the stale and include_state flags and expires_at_unix.
// Nothing panics, a rejection is a 4xx, and what is accepted is in range
// (an expiry within the hour ahead).
func FuzzRequestHeaders(f *testing.F) {
	f.Add("1", "0", "1.5s", `"7"`, "1", int64(0))
	f.Add(" 42 ", "-1", "0s", "", "true", int64(-1))
	f.Add("0", "9223372036854775808", "25h", "x", "yes", int64(1<<40))
	f.Add("-5", "1e3", "1ns", `"0"`, "", int64(1))
	f.Add("0x10", " 3 ", "-1s", "\"", "TRUE", int64(0))
	f.Add("7", "2", "1m", "", "false", int64(9223372036854775))
	f.Add("7", "2", "1m", "", "false", int64(math.MaxInt64))
	f.Add("", "", "24h0m0.000000001s", "9223372036854775807", "0", int64(0))
	f.Fuzz(func(t *testing.T, fencing, ifVersion, timeout, etag, flag string, expires int64) {
		r := httptest.NewRequest(http.MethodPost, "/?stale="+url.QueryEscape(flag)+"&include_state="+url.QueryEscape(flag), nil)
		r.Header.Set(wire.HeaderFencingToken, fencing)
		r.Header.Set(wire.HeaderIfVersion, ifVersion)
		r.Header.Set(wire.HeaderTimeout, timeout)
		for _, required := range []bool{false, true} {
			n, err := fencingHeader(r, required)
			switch {
			case err != nil:
				badRequest(t, "fencing token", err)
			case fencing == "" && n != 0:
				t.Fatalf("no fencing token read as %d", n)
			case fencing != "" && (n <= 0 || strconv.FormatInt(n, 10) != strings.TrimLeft(strings.TrimSpace(fencing), "+0")):
				t.Fatalf("fencing token %q read as %d", fencing, n)
			}
		}
		if c, err := conditions(r); err != nil {
			badRequest(t, "If-Version", err)
		} else if c.IfVersion != nil && *c.IfVersion < 0 {
			t.Fatalf("If-Version %q read as %d", ifVersion, *c.IfVersion)
		}
		start := time.Now()
		if ctx, cancel, err := withClientTimeout(r); err != nil {
			badRequest(t, "timeout", err)
		} else {
			d, ok := ctx.Deadline()
			cancel()
			if timeout != "" && (!ok || d.Before(start) || d.Sub(start) > maxClientTimeout+time.Second) {
				t.Fatalf("timeout %q gave deadline %v (ok %v)", timeout, d, ok)
			}
		}
		if _, err := leaseRefFromHeaders(r); err != nil {
			badRequest(t, "lease reference", err)
		}
		for _, tok := range []int64{0, 7, -1} {
			if ref, err := messageRef(r, "", "q", "m", "l", tok, etag, ""); err != nil {
				badRequest(t, "meta_etag", err)
			} else if ref.Token < 0 || (tok > 0 && ref.Token != tok) {
				t.Fatalf("meta_etag %q with token %d gave token %d", etag, tok, ref.Token)
			}
		}
		if _, err := consistency(r); err != nil {
			badRequest(t, "stale", err)
		}
		if _, err := boolParam(r, "include_state"); err != nil {
			badRequest(t, "include_state", err)
		}
		if at, err := expiresAt(expires, start, time.Hour); err != nil {
			badRequest(t, "expires_at_unix", err)
		} else if expires != 0 && (!at.After(start) || at.After(start.Add(time.Hour+time.Second))) {
			t.Fatalf("expires_at_unix %d accepted as %v, %v from now", expires, at, at.Sub(start))
		}
	})
}
