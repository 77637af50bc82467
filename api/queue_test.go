package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
	"github.com/rs/xid"
)

func (e *env) client() *client.Client {
	e.t.Helper()
	c, err := client.New(e.url, client.WithRetry(0), client.WithHTTPClient(e.hc))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// enqueueRaw posts a multipart body with the given parts (name, content
// type, body) as contentType (multipart/form-data or multipart/related).
func (e *env) enqueueRaw(mediaType string, header map[string]string, parts ...[3]string) resp {
	e.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="`+p[0]+`"`)
		if p[1] != "" {
			h.Set("Content-Type", p[1])
		}
		w, err := mw.CreatePart(h)
		if err != nil {
			e.t.Fatal(err)
		}
		_, _ = w.Write([]byte(p[2]))
	}
	_ = mw.Close()
	h := map[string]string{"Content-Type": mediaType + "; boundary=" + mw.Boundary()}
	for k, v := range header {
		h[k] = v
	}
	return e.do(http.MethodPost, "/v1/queue/enqueue", h, buf.String())
}

func (e *env) enqueue(queue, payload string) wire.EnqueueResponse {
	e.t.Helper()
	r := e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "application/json", `{"queue":"` + queue + `"}`},
		[3]string{"payload", "text/plain", payload})
	if r.status != http.StatusOK {
		e.t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	var out wire.EnqueueResponse
	r.json(e.t, &out)
	return out
}

// rawDelivery is one delivery of a multipart answer, read part by part.
type rawDelivery struct {
	meta          wire.DequeueResponse
	metaHeader    textproto.MIMEHeader
	payload       []byte
	payloadHeader textproto.MIMEHeader
}

func parseDeliveries(t *testing.T, r resp) []rawDelivery {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("dequeue: %d %s", r.status, r.body)
	}
	mt, params, err := mime.ParseMediaType(r.header.Get("Content-Type"))
	if err != nil || mt != "multipart/related" {
		t.Fatalf("content type %q", r.header.Get("Content-Type"))
	}
	mr := multipart.NewReader(bytes.NewReader(r.body), params["boundary"])
	var out []rawDelivery
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var d rawDelivery
		if p.FormName() != "meta" {
			t.Fatalf("part %q where meta belongs", p.FormName())
		}
		d.metaHeader = p.Header
		if err := json.NewDecoder(p).Decode(&d.meta); err != nil {
			t.Fatal(err)
		}
		if p, err = mr.NextPart(); err != nil || p.FormName() != "payload" {
			t.Fatalf("payload part: %v", err)
		}
		d.payloadHeader = p.Header
		d.payload, _ = io.ReadAll(p)
		out = append(out, d)
	}
}

func (e *env) dequeueRaw(body string) resp {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/queue/dequeue", map[string]string{"Content-Type": "application/json"}, body)
}

func (e *env) dequeueOne(queue string) rawDelivery {
	e.t.Helper()
	ds := parseDeliveries(e.t, e.dequeueRaw(`{"queue":"`+queue+`","owner":"w","wait_seconds":-1}`))
	if len(ds) != 1 || ds[0].meta.Message == nil {
		e.t.Fatalf("want one delivery, got %+v", ds)
	}
	return ds[0]
}

func ackBody(m *wire.Message) map[string]any {
	return map[string]any{"namespace": m.Namespace, "queue": m.Queue, "message_id": m.MessageID, "lease_id": m.LeaseID,
		"fencing_token": m.FencingToken, "meta_etag": m.MetaETag}
}

func (e *env) stats(queue string) wire.QueueStatsResponse {
	e.t.Helper()
	r := e.post("/v1/queue/stats", nil, wire.QueueStatsRequest{Queue: queue})
	if r.status != http.StatusOK {
		e.t.Fatalf("stats: %d %s", r.status, r.body)
	}
	var st wire.QueueStatsResponse
	r.json(e.t, &st)
	return st
}

func TestQueueEnqueueDequeueAck(t *testing.T) {
	e := newEnv(t)
	before := time.Now().Unix()
	enq := e.enqueueRaw("multipart/form-data", map[string]string{"X-Correlation-Id": "corr-1"},
		[3]string{"meta", "application/json", `{"queue":"jobs","attributes":{"kind":"x"},"payload_content_type":"application/json","max_attempts":3,"visibility_timeout_seconds":40}`},
		[3]string{"payload", "application/json", `{"n":1}`})
	if enq.status != http.StatusOK {
		t.Fatalf("enqueue: %d %s", enq.status, enq.body)
	}
	var er wire.EnqueueResponse
	enq.json(t, &er)
	if er.Namespace != "default" || er.Queue != "jobs" || er.MessageID == "" || er.MaxAttempts != 3 || er.PayloadBytes != 7 ||
		er.VisibilityTimeoutSeconds != 40 || er.Attempts != 0 || er.NotVisibleUntilUnix < before || er.CorrelationID != "corr-1" {
		t.Fatalf("enqueue response %+v", er)
	}
	st := e.stats("jobs")
	if !st.Available || st.HeadMessageID != er.MessageID || st.Ready != 1 || st.PendingCandidates != 1 || st.HeadEnqueuedAtUnix < before {
		t.Fatalf("stats %+v", st)
	}

	r := e.dequeueRaw(`{"queue":"jobs","owner":"w1","wait_seconds":-1}`)
	ds := parseDeliveries(t, r)
	if len(ds) != 1 {
		t.Fatalf("%d deliveries", len(ds))
	}
	d := ds[0]
	m := d.meta.Message
	if m.MessageID != er.MessageID || m.Queue != "jobs" || m.Namespace != "default" || m.Attempts != 1 || m.FailureAttempts != 0 ||
		m.MaxAttempts != 3 || m.LeaseID == "" || m.FencingToken != 1 || m.MetaETag != "1" || m.PayloadBytes != 7 ||
		m.PayloadContentType != "application/json" || string(m.Attributes) != `{"kind":"x"}` || m.VisibilityTimeoutSeconds != 40 ||
		m.LeaseExpiresAtUnix < before+39 || m.StateLeaseID != "" || m.TxnID != "" {
		t.Fatalf("message %+v", m)
	}
	if string(d.payload) != `{"n":1}` || d.payloadHeader.Get("Content-Type") != "application/json" ||
		d.payloadHeader.Get("Content-Length") != "7" || d.metaHeader.Get("Content-Type") != "application/json" {
		t.Fatalf("payload %q headers %v / %v", d.payload, d.payloadHeader, d.metaHeader)
	}
	if st := e.stats("jobs"); st.Available || st.InFlight != 1 || st.Ready != 0 {
		t.Fatalf("stats while in flight %+v", st)
	}
	// Nothing else is ready: 409 waiting as lockd answers, at once for -1,
	// after the wait with its length as the retry hint otherwise.
	env := wantErr(t, e.dequeueRaw(`{"queue":"jobs","owner":"w2","wait_seconds":-1}`), http.StatusConflict, "waiting")
	if _, ok := env["retry_after_seconds"]; ok {
		t.Fatalf("no-wait dequeue has a retry hint: %v", env)
	}
	started := time.Now()
	r = e.dequeueRaw(`{"queue":"jobs","owner":"w2","wait_seconds":1}`)
	env = wantErr(t, r, http.StatusConflict, "waiting")
	if env["retry_after_seconds"] != float64(1) || r.header.Get("Retry-After") != "1" || time.Since(started) < 900*time.Millisecond {
		t.Fatalf("waiting answer %v after %s", env, time.Since(started))
	}

	ack := e.post("/v1/queue/ack", nil, ackBody(m))
	if ack.status != http.StatusOK || !strings.Contains(string(ack.body), `"acked":true`) {
		t.Fatalf("ack: %d %s", ack.status, ack.body)
	}
	if st := e.stats("jobs"); st.Available || st.InFlight != 0 || st.Ready != 0 {
		t.Fatalf("stats after ack %+v", st)
	}
	// The message is gone. The same ack again (a retry after a lost
	// answer) is answered as the first; another delivery's lease is not.
	if again := e.post("/v1/queue/ack", nil, ackBody(m)); again.status != http.StatusOK || !strings.Contains(string(again.body), `"acked":true`) {
		t.Fatalf("retried ack: %d %s", again.status, again.body)
	}
	other := ackBody(m)
	other["lease_id"], other["fencing_token"] = xid.New().String(), 0
	wantErr(t, e.post("/v1/queue/ack", nil, other), http.StatusNotFound, "queue_message_not_found")
	wantErr(t, e.dequeueRaw(`{"queue":"jobs","owner":"w2","wait_seconds":-1}`), http.StatusConflict, "waiting")
}

func TestQueueEmptyPayloadAndQueryOverrides(t *testing.T) {
	e := newEnv(t)
	// No meta part: the queue and namespace come from the query; no payload.
	r := e.enqueueRaw("multipart/form-data", nil)
	wantErr(t, r, http.StatusBadRequest, "invalid_queue")
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	_ = mw.Close()
	r = e.do(http.MethodPost, "/v1/queue/enqueue?queue=q1&namespace=Other", map[string]string{"Content-Type": mw.FormDataContentType()}, buf.String())
	if r.status != http.StatusOK {
		t.Fatalf("enqueue without parts: %d %s", r.status, r.body)
	}
	var er wire.EnqueueResponse
	r.json(t, &er)
	if er.Namespace != "other" || er.Queue != "q1" || er.PayloadBytes != 0 {
		t.Fatalf("enqueue %+v", er)
	}
	ds := parseDeliveries(t, e.do(http.MethodPost, "/v1/queue/dequeue?queue=q1&owner=o&namespace=other", nil, `{"wait_seconds":-1}`))
	if len(ds) != 1 || len(ds[0].payload) != 0 || ds[0].payloadHeader.Get("Content-Length") != "0" ||
		ds[0].payloadHeader.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("deliveries %+v", ds)
	}
}

func TestQueueErrors(t *testing.T) {
	e := newEnvWith(t, func(c *config.Server) { c.MaxPayloadBytes = 1024 })
	meta := [3]string{"meta", "application/json", `{"queue":"q"}`}
	// Enqueue.
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"bad queue!"}`}), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":".hidden"}`}), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q",`}), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q","bogus":1}`}), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q","attributes":[1]}`}), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", "{\"queue\":\"q\",\"attributes\":{\"a\":\"\xff\"}}"}),
		http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q","delay_seconds":-1}`}), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q","txn_id":"nope"}`}), http.StatusBadRequest, "invalid_txn")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, meta, meta), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, meta, [3]string{"payload", "", "a"}, [3]string{"payload", "", "b"}),
		http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, meta, [3]string{"payload", "", strings.Repeat("x", 1025)}),
		http.StatusRequestEntityTooLarge, "payload_too_large")
	if r := e.enqueueRaw("multipart/form-data", nil, meta, [3]string{"payload", "", strings.Repeat("x", 1024)}); r.status != http.StatusOK {
		t.Fatalf("payload of exactly the limit: %d %s", r.status, r.body)
	}
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"q","payload_content_type":"` + strings.Repeat("t", 70<<10) + `"}`}),
		http.StatusRequestEntityTooLarge, "request_too_large")
	// The whole body is bounded too.
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, meta, [3]string{"payload", "", strings.Repeat("x", 1<<20)}),
		http.StatusRequestEntityTooLarge, "payload_too_large")
	wantErr(t, e.do(http.MethodPost, "/v1/queue/enqueue", map[string]string{"Content-Type": "application/json"}, `{"queue":"q"}`),
		http.StatusBadRequest, "invalid_body")
	wantErr(t, e.do(http.MethodPost, "/v1/queue/enqueue", map[string]string{"Content-Type": "multipart/form-data"}, `x`),
		http.StatusBadRequest, "invalid_body")
	// A body cut short is refused wherever it ends, and enqueues nothing;
	// only the closing delimiter ends it (a line break, spaces or an
	// epilogue may follow).
	formB := map[string]string{"Content-Type": "multipart/form-data; boundary=b"}
	metaPart := "--b\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"queue\":\"cut\"}\r\n"
	payloadHeader := "--b\r\nContent-Disposition: form-data; name=\"payload\""
	for _, cut := range []string{metaPart, metaPart + "--b", metaPart + "--b-", metaPart + "--b\r\n", metaPart + "--b--\r",
		metaPart + "--b--x", metaPart + payloadHeader, metaPart + payloadHeader + "\r\n",
		metaPart + payloadHeader + "\r\n\r\nabc", metaPart + payloadHeader + "\r\n\r\nabc\r\n--b\r\n"} {
		wantErr(t, e.do(http.MethodPost, "/v1/queue/enqueue", formB, cut), http.StatusBadRequest, "invalid_body")
	}
	if st := e.stats("cut"); st.Ready != 0 {
		t.Fatalf("bodies cut short enqueued %d messages", st.Ready)
	}
	ends := []string{"--b--", "--b--\r\n", "--b-- \t", "--b--\r\nepilogue", payloadHeader + "\r\n\r\nabc\r\n--b--"}
	for _, end := range ends {
		if r := e.do(http.MethodPost, "/v1/queue/enqueue", formB, metaPart+end); r.status != http.StatusOK {
			t.Fatalf("body ending %q: %d %s", end, r.status, r.body)
		}
	}
	if st := e.stats("cut"); st.Ready != len(ends) {
		t.Fatalf("%d messages from %d complete bodies", st.Ready, len(ends))
	}
	wantErr(t, e.do(http.MethodPost, "/v1/queue/enqueue", map[string]string{"Content-Type": "multipart/form-data; boundary=b"}, "garbage"),
		http.StatusBadRequest, "invalid_body")
	wantErr(t, e.enqueueRaw("multipart/form-data", map[string]string{wire.HeaderIdempotencyKey: strings.Repeat("k", 200)}, meta),
		http.StatusBadRequest, "invalid_idempotency_key")
	wantErr(t, e.do(http.MethodGet, "/v1/queue/enqueue", nil, ""), http.StatusMethodNotAllowed, "method_not_allowed")

	// Dequeue.
	wantErr(t, e.dequeueRaw(`{"queue":"q"}`), http.StatusBadRequest, "missing_owner")
	wantErr(t, e.dequeueRaw(`{"owner":"o"}`), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.dequeueRaw(`{"queue":"q/x","owner":"o"}`), http.StatusBadRequest, "invalid_queue")
	// Only a dead-letter queue may be longer than 128 characters, by its suffix.
	longest := strings.Repeat("q", 128)
	wantErr(t, e.dequeueRaw(`{"queue":"`+longest+`x","owner":"o"}`), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.dequeueRaw(`{"queue":"`+longest+`x.dlq","owner":"o"}`), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.enqueueRaw("multipart/form-data", nil, [3]string{"meta", "", `{"queue":"` + longest + `.dlq"}`}),
		http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.dequeueRaw(`{"queue":"q","owner":"o","wait_seconds":-2}`), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.dequeueRaw(`{"queue":"q","owner":"o","visibility_timeout_seconds":-2}`), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.dequeueRaw(`{"queue":"q","owner":"o","txn_id":"x"}`), http.StatusBadRequest, "invalid_txn")
	wantErr(t, e.dequeueRaw(`{"queue":"q","owner":"o","extra":1}`), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.dequeueRaw(`not json`), http.StatusBadRequest, "invalid_body")
	wantErr(t, e.do(http.MethodPost, "/v1/queue/dequeueWithState?include_state=maybe", nil, `{"queue":"q","owner":"o"}`),
		http.StatusBadRequest, "invalid_params")
	wantErr(t, e.do(http.MethodPost, "/v1/queue/subscribe", nil, `{"queue":"q"}`), http.StatusBadRequest, "missing_owner")

	// Ack, nack, extend.
	m := e.dequeueOne("q").meta.Message
	body := func(change func(map[string]any)) map[string]any {
		b := ackBody(m)
		change(b)
		return b
	}
	for _, path := range []string{"/v1/queue/ack", "/v1/queue/nack", "/v1/queue/extend"} {
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { delete(b, "queue") })), http.StatusBadRequest, "invalid_queue")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { delete(b, "message_id") })), http.StatusBadRequest, "invalid_params")
		env := wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["message_id"] = strings.Repeat("m", 65) })), http.StatusBadRequest, "invalid_params")
		if d, _ := env["detail"].(string); !strings.Contains(d, "1-64 printable bytes") {
			t.Errorf("%s with a 65-byte message id: detail %q", path, d)
		}
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { delete(b, "lease_id") })), http.StatusBadRequest, "missing_lease")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["lease_id"] = "not-an-xid" })), http.StatusBadRequest, "invalid_lease")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["fencing_token"] = -1 })), http.StatusBadRequest, "invalid_fencing_token")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["txn_id"] = "x" })), http.StatusBadRequest, "invalid_txn")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["unknown"] = true })), http.StatusBadRequest, "invalid_body")
		wantErr(t, e.post(path, nil, `{"queue":`), http.StatusBadRequest, "invalid_body")
		// A stale or foreign delivery: another lease, an older token, another meta_etag.
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["lease_id"] = "c5v9d0sl70b3m3q8ndg0" })),
			http.StatusConflict, "queue_message_lease_mismatch")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["fencing_token"] = 7; delete(b, "meta_etag") })),
			http.StatusConflict, "queue_message_lease_mismatch")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["meta_etag"] = "7" })),
			http.StatusConflict, "queue_message_lease_mismatch")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["meta_etag"] = "junk"; delete(b, "fencing_token") })),
			http.StatusConflict, "queue_message_lease_mismatch")
		wantErr(t, e.post(path, nil, body(func(b map[string]any) { b["message_id"] = "no-such-message" })),
			http.StatusNotFound, "queue_message_not_found")
	}
	wantErr(t, e.post("/v1/queue/nack", nil, body(func(b map[string]any) { b["intent"] = "later" })), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.post("/v1/queue/nack", nil, body(func(b map[string]any) { b["delay_seconds"] = -3 })), http.StatusBadRequest, "invalid_params")
	raw, _ := json.Marshal(ackBody(m))
	wantErr(t, e.post("/v1/queue/nack", nil, strings.TrimSuffix(string(raw), "}")+",\"last_error\":\"\xff\"}"),
		http.StatusBadRequest, "invalid_body")
	// Seconds out of range are refused naming the field (within range, a
	// value above the server's maximum is capped).
	for _, by := range []int64{-3, 4e9} {
		env := wantErr(t, e.post("/v1/queue/extend", nil, body(func(b map[string]any) { b["extend_by_seconds"] = by })),
			http.StatusBadRequest, "invalid_params")
		if d, _ := env["detail"].(string); !strings.HasPrefix(d, "extend_by_seconds ") {
			t.Fatalf("extend_by_seconds %d: detail %q", by, d)
		}
	}
	env := wantErr(t, e.dequeueRaw(`{"queue":"q","owner":"o","wait_seconds":4000000000}`), http.StatusBadRequest, "invalid_params")
	if d, _ := env["detail"].(string); !strings.HasPrefix(d, "wait_seconds ") {
		t.Fatalf("wait_seconds: detail %q", d)
	}
	wantErr(t, e.post("/v1/queue/stats", nil, `{"queue":""}`), http.StatusBadRequest, "invalid_queue")
	wantErr(t, e.post("/v1/queue/stats?stale=perhaps", nil, `{"queue":"q"}`), http.StatusBadRequest, "invalid_params")
	wantErr(t, e.post("/v1/queue/stats", nil, `{"queue":"q","namespace":".txns"}`), http.StatusBadRequest, "invalid_namespace")

	// A delivery whose lease ran out is no longer the caller's.
	if r := e.post("/v1/queue/ack", nil, ackBody(m)); r.status != http.StatusOK {
		t.Fatalf("ack of the live delivery: %d %s", r.status, r.body)
	}
}

func TestQueueIdempotentEnqueue(t *testing.T) {
	e := newEnv(t)
	h := map[string]string{wire.HeaderIdempotencyKey: "once"}
	parts := [][3]string{{"meta", "", `{"queue":"q"}`}, {"payload", "", "x"}}
	var ids []string
	enqueue := func() {
		r := e.enqueueRaw("multipart/form-data", h, parts...)
		var er wire.EnqueueResponse
		r.json(t, &er)
		ids = append(ids, er.MessageID)
	}
	enqueue()
	enqueue()
	if ids[0] == "" || ids[0] != ids[1] {
		t.Fatalf("retried enqueue gave ids %v", ids)
	}
	if st := e.stats("q"); st.Ready != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A retry whose first answer was lost while a consumer took the
	// message and acknowledged it does not enqueue it again.
	d := e.dequeueOne("q")
	if r := e.post("/v1/queue/ack", nil, ackBody(d.meta.Message)); r.status != http.StatusOK {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	enqueue()
	if ids[2] != ids[0] {
		t.Fatalf("retry after the ack gave ids %v", ids)
	}
	if st := e.stats("q"); st.Ready+st.InFlight != 0 {
		t.Fatalf("stats after a retry of a consumed enqueue: %+v", st)
	}
}

func TestQueueNackRedeliversAndDeadLetters(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	if _, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "work", MaxAttempts: 2}, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	get := func(wait int64) *client.Delivery {
		t.Helper()
		d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "work", Owner: "w", WaitSeconds: wait})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := get(-1)
	// Defer does not count as a failure.
	if out, err := d.Nack(ctx, wire.NackIntentDefer, 0, nil); err != nil || !out.Requeued || out.MetaETag != "" {
		t.Fatalf("defer: %+v %v", out, err)
	}
	d = get(-1)
	if d.Message.Attempts != 2 || d.Message.FailureAttempts != 0 || d.Message.FencingToken != 2 || d.Message.MetaETag != "2" {
		t.Fatalf("after defer: %+v", d.Message)
	}
	// A failure with a delay: not visible until the delay has passed.
	out, err := d.Nack(ctx, wire.NackIntentFailure, 2*time.Second, json.RawMessage(`{"why":"boom"}`))
	if err != nil || !out.Requeued || out.DeadLetterQueue != "" {
		t.Fatalf("nack: %+v %v", out, err)
	}
	nacked := time.Now()
	if _, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "work", Owner: "w", WaitSeconds: wire.BlockNoWait}); !errors.Is(err, errcode.Waiting) {
		t.Fatalf("dequeue during the delay: %v", err)
	}
	if st := e.stats("work"); st.Delayed != 1 || st.Available {
		t.Fatalf("stats during the delay %+v", st)
	}
	d = get(10)
	if waited := time.Since(nacked); waited < 1500*time.Millisecond {
		t.Fatalf("redelivered after %s, before the 2s delay", waited)
	}
	if d.Message.Attempts != 3 || d.Message.FailureAttempts != 1 || string(d.Payload) != "p1" {
		t.Fatalf("redelivery %+v", d.Message)
	}
	// The second failure is the last allowed: the message moves to work.dlq.
	out, err = d.Nack(ctx, "", 0, nil)
	if err != nil || out.Requeued || out.DeadLetterQueue != "work"+wire.DeadLetterSuffix {
		t.Fatalf("last nack: %+v %v", out, err)
	}
	if _, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "work", Owner: "w", WaitSeconds: wire.BlockNoWait}); !errors.Is(err, errcode.Waiting) {
		t.Fatalf("dequeue from the failed queue: %v", err)
	}
	if st := e.stats("work"); st.DeadLetterReady != 1 {
		t.Fatalf("stats %+v", st)
	}
	dead, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "work.dlq", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil || string(dead.Payload) != "p1" || dead.Message.Queue != "work.dlq" || dead.Message.MessageID != d.Message.MessageID {
		t.Fatalf("dead letter: %+v %v", dead, err)
	}
	if err := dead.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// The dead-letter queue of a queue with the longest name is 4 characters
// longer ("<queue>.dlq"), and can be consumed all the same.
func TestQueueDeadLettersOfTheLongestName(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	queue := strings.Repeat("q", 128)
	if _, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: queue, MaxAttempts: 1}, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: queue, Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	out, err := d.Nack(ctx, wire.NackIntentFailure, 0, nil)
	dlq := queue + wire.DeadLetterSuffix
	if err != nil || out.Requeued || out.DeadLetterQueue != dlq {
		t.Fatalf("nack: %+v %v", out, err)
	}
	if st := e.stats(dlq); st.Ready != 1 {
		t.Fatalf("dead-letter queue stats %+v", st)
	}
	dead, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: dlq, Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil || string(dead.Payload) != "p1" || dead.Message.Queue != dlq {
		t.Fatalf("dead letter: %+v %v", dead, err)
	}
	if err := dead.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(dlq); st.Ready != 0 || st.InFlight != 0 {
		t.Fatalf("dead-letter queue stats after the ack %+v", st)
	}
}

func TestQueueExtend(t *testing.T) {
	e := newEnv(t)
	e.enqueue("q", "x")
	m := e.dequeueOne("q").meta.Message
	b := ackBody(m)
	b["extend_by_seconds"] = 100
	r := e.post("/v1/queue/extend", nil, b)
	if r.status != http.StatusOK {
		t.Fatalf("extend: %d %s", r.status, r.body)
	}
	var out wire.ExtendResponse
	r.json(t, &out)
	if now := time.Now().Unix(); out.LeaseExpiresAtUnix < now+98 || out.LeaseExpiresAtUnix > now+101 ||
		out.VisibilityTimeoutSeconds != 100 || out.MetaETag != m.MetaETag {
		t.Fatalf("extend %+v", out)
	}
	if r := e.post("/v1/queue/ack", nil, ackBody(m)); r.status != http.StatusOK {
		t.Fatalf("ack after extend: %d %s", r.status, r.body)
	}
}

func TestQueueStatefulDequeue(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	enq, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "flows"}, []byte("step"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.DequeueWithState(ctx, wire.DequeueRequest{Queue: "flows", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	ref, ok := d.StateRef()
	if !ok || d.State == nil || d.State.Exists || d.Message.StateFencingToken < 1 || d.Message.StateTxnID == "" ||
		d.Message.StateLeaseExpiresAtUnix < time.Now().Unix() || ref.Key != "q/flows/state/"+enq.MessageID {
		t.Fatalf("stateful delivery %+v state %+v", d.Message, d.State)
	}
	if _, err := c.Update(ctx, ref, []byte(`{"step":1}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	// Nack keeps the sidecar with the consumer's update.
	if _, err := d.Nack(ctx, wire.NackIntentDefer, 0, nil); err != nil {
		t.Fatal(err)
	}
	d, err = c.DequeueWithState(ctx, wire.DequeueRequest{Queue: "flows", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	if !d.State.Exists || string(d.State.Body) != `{"step":1}` || d.State.ETag == "" || d.Message.StateETag != d.State.ETag {
		t.Fatalf("state after nack: %+v %+v", d.State, d.Message)
	}
	// The raw answer of dequeueWithState without include_state is lockd's
	// layout: meta and payload only.
	e.enqueue("flows", "second")
	ds := parseDeliveries(t, e.do(http.MethodPost, "/v1/queue/dequeueWithState", nil, `{"queue":"flows","owner":"w","wait_seconds":-1}`))
	if len(ds) != 1 || ds[0].meta.Message.StateLeaseID == "" || string(ds[0].payload) != "second" {
		t.Fatalf("raw stateful delivery %+v", ds)
	}
	// Ack deletes the sidecar.
	ref, _ = d.StateRef()
	if _, err := c.Update(ctx, ref, []byte(`{"step":2}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	doc, err := c.GetPublic(ctx, "", ref.Key)
	if err != nil || doc.Exists {
		t.Fatalf("sidecar after ack: %+v %v", doc, err)
	}
}

// A dead letter takes its state sidecar along: a stateful delivery from the
// dead-letter queue sees what the failed consumer left, and its ack deletes
// it. The server's leader adopts the rules that move it by itself.
func TestQueueDeadLetterKeepsItsState(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	node := e.srv.Node()
	deadline := time.Now().Add(10 * time.Second)
	for node.FSM().Rules() < fsm.EntryFormat {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not adopt entry format %d's rules (rules %d)", fsm.EntryFormat, node.FSM().Rules())
		}
		time.Sleep(10 * time.Millisecond)
	}
	enq, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "flows", MaxAttempts: 1}, []byte("step"))
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.DequeueWithState(ctx, wire.DequeueRequest{Queue: "flows", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := d.StateRef()
	if _, err := c.Update(ctx, ref, []byte(`{"step":1}`), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := d.Nack(ctx, wire.NackIntentFailure, 0, nil); err != nil || out.DeadLetterQueue != "flows"+wire.DeadLetterSuffix {
		t.Fatalf("nack: %+v %v", out, err)
	}
	if doc, err := c.GetPublic(ctx, "", ref.Key); err != nil || doc.Exists {
		t.Fatalf("the sidecar stayed in the failed queue: %+v %v", doc, err)
	}
	dead, err := c.DequeueWithState(ctx, wire.DequeueRequest{Queue: "flows.dlq", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil {
		t.Fatal(err)
	}
	deadRef, _ := dead.StateRef()
	if dead.Message.MessageID != enq.MessageID || deadRef.Key != "q/flows.dlq/state/"+enq.MessageID ||
		!dead.State.Exists || string(dead.State.Body) != `{"step":1}` {
		t.Fatalf("the dead letter's state: %+v %+v", dead.Message, dead.State)
	}
	if err := dead.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if doc, err := c.GetPublic(ctx, "", deadRef.Key); err != nil || doc.Exists {
		t.Fatalf("the dead letter's sidecar after its ack: %+v %v", doc, err)
	}
}

func TestQueueBlockedConsumerGetsLaterMessage(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	got := make(chan *client.Delivery, 1)
	errs := make(chan error, 1)
	go func() {
		d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "later", Owner: "w", WaitSeconds: 20})
		if err != nil {
			errs <- err
			return
		}
		got <- d
	}()
	testutil.WaitFor(t, 10*time.Second, "the consumer to wait", func() bool { return e.stats("later").WaitingConsumers == 1 })
	enq := e.enqueue("later", "hello")
	select {
	case d := <-got:
		if d.Message.MessageID != enq.MessageID || string(d.Payload) != "hello" {
			t.Fatalf("delivery %+v", d)
		}
	case err := <-errs:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting consumer did not receive the message")
	}
	if st := e.stats("later"); st.WaitingConsumers != 0 || st.InFlight != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueSubscribe(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	for i := range 3 {
		e.enqueue("feed", fmt.Sprintf("m%d", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- c.Subscribe(ctx, wire.DequeueRequest{Queue: "feed", Owner: "sub", WaitSeconds: 5}, func(d *client.Delivery) error {
			got = append(got, string(d.Payload))
			if err := d.Ack(ctx); err != nil {
				return err
			}
			if len(got) == 3 {
				// Messages enqueued while the stream is open arrive on it.
				e.enqueue("feed", "m3")
				e.enqueue("feed", "m4")
			}
			if len(got) == 5 {
				cancel()
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("subscribe ended with %v after %v", err, got)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("subscription did not end; received %v", got)
	}
	if strings.Join(got, ",") != "m0,m1,m2,m3,m4" {
		t.Fatalf("received %v", got)
	}
	// The server notices that the subscriber went away.
	testutil.WaitFor(t, 10*time.Second, "the subscription to end on the server", func() bool {
		st := e.stats("feed")
		return st.WaitingConsumers == 0 && st.InFlight == 0
	})
	// With wait_seconds -1 a subscription drains what is ready and ends; on
	// an empty queue it is 409 waiting. (Another queue: the subscription
	// above may not have noticed yet that its client went away, and take a
	// message of its queue before it hands it back.)
	// A stream without waiting also ends when its page of unfinished
	// deliveries is full (one here): the client opens another while they
	// deliver.
	for _, m := range []string{"1", "2", "3", "4", "last"} {
		e.enqueue("drained", m)
	}
	var drained []string
	err := c.Subscribe(testCtx(t), wire.DequeueRequest{Queue: "drained", Owner: "sub", WaitSeconds: wire.BlockNoWait}, func(d *client.Delivery) error {
		drained = append(drained, string(d.Payload))
		return d.Ack(context.Background())
	})
	if err != nil || strings.Join(drained, ",") != "1,2,3,4,last" {
		t.Fatalf("drain: %v %v", drained, err)
	}
	wantErr(t, e.do(http.MethodPost, "/v1/queue/subscribe", nil, `{"queue":"drained","owner":"o","wait_seconds":-1}`),
		http.StatusConflict, "waiting")
}

func TestQueueSubscribeRawStream(t *testing.T) {
	e := newEnv(t)
	e.enqueue("raw", "a")
	e.enqueue("raw", "b")
	r := e.do(http.MethodPost, "/v1/queue/subscribeWithState?include_state=1", nil, `{"queue":"raw","owner":"o","wait_seconds":-1,"page_size":2}`)
	_, params, _ := mime.ParseMediaType(r.header.Get("Content-Type"))
	mr := multipart.NewReader(bytes.NewReader(r.body), params["boundary"])
	var names []string
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, p.FormName())
	}
	if strings.Join(names, ",") != "meta,payload,state,meta,payload,state" {
		t.Fatalf("parts %v", names)
	}
}

// TestQueueLockdClientWire replays what lockd's Go client sends for
// enqueue, dequeue, extend, nack and ack, byte for byte in shape: the
// enqueue body is multipart/related, streamed without a length, with a meta
// part (application/json) and a payload part; dequeue answers are read
// part by part the way the client reads them.
func TestQueueLockdClientWire(t *testing.T) {
	e := newEnv(t)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		h := textproto.MIMEHeader{}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Disposition", `form-data; name="meta"`)
		part, _ := mw.CreatePart(h)
		_ = json.NewEncoder(part).Encode(map[string]any{"namespace": "default", "queue": "orders", "delay_seconds": 0,
			"visibility_timeout_seconds": 30, "max_attempts": 5, "attributes": map[string]any{"tenant": "a"},
			"payload_content_type": "application/json"})
		h = textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="payload"`)
		h.Set("Content-Type", "application/json")
		part, _ = mw.CreatePart(h)
		_, _ = part.Write([]byte(`{"order":42}`))
		_ = mw.Close()
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/queue/enqueue", pr)
	req.Header.Set("Content-Type", "multipart/related; boundary="+mw.Boundary())
	res, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("lockd-style enqueue: %d %s", res.StatusCode, raw)
	}
	var enq struct {
		Namespace    string `json:"namespace"`
		Queue        string `json:"queue"`
		MessageID    string `json:"message_id"`
		MaxAttempts  int    `json:"max_attempts"`
		PayloadBytes int64  `json:"payload_bytes"`
	}
	if err := json.Unmarshal(raw, &enq); err != nil || enq.Queue != "orders" || enq.MessageID == "" || enq.MaxAttempts != 5 || enq.PayloadBytes != 12 {
		t.Fatalf("enqueue answer %s (%v)", raw, err)
	}

	// lockd's dequeue request: its DequeueRequest with page_size and an empty cursor.
	dq := e.dequeueRaw(`{"namespace":"default","queue":"orders","owner":"worker-1","visibility_timeout_seconds":30,"wait_seconds":-1,"page_size":1}`)
	ds := parseDeliveries(t, dq)
	if len(ds) != 1 || string(ds[0].payload) != `{"order":42}` || ds[0].payloadHeader.Get("Content-Length") != "12" {
		t.Fatalf("deliveries %+v", ds)
	}
	m := ds[0].meta.Message
	if m.MessageID != enq.MessageID || string(m.Attributes) != `{"tenant":"a"}` || m.PayloadContentType != "application/json" {
		t.Fatalf("message %+v", m)
	}
	// Extend, nack (intent failure by default) and ack with lockd's bodies.
	ext := e.post("/v1/queue/extend", nil, map[string]any{"namespace": "default", "queue": "orders", "message_id": m.MessageID,
		"lease_id": m.LeaseID, "fencing_token": m.FencingToken, "meta_etag": m.MetaETag, "extend_by_seconds": 60})
	var er wire.ExtendResponse
	ext.json(t, &er)
	if ext.status != http.StatusOK || er.MetaETag != m.MetaETag {
		t.Fatalf("extend: %d %s", ext.status, ext.body)
	}
	nack := e.post("/v1/queue/nack", nil, map[string]any{"namespace": "default", "queue": "orders", "message_id": m.MessageID,
		"lease_id": m.LeaseID, "fencing_token": m.FencingToken, "meta_etag": er.MetaETag, "last_error": "timeout"})
	if nack.status != http.StatusOK || !strings.Contains(string(nack.body), `"requeued":true`) {
		t.Fatalf("nack: %d %s", nack.status, nack.body)
	}
	m = e.dequeueOne("orders").meta.Message
	ack := e.post("/v1/queue/ack", nil, map[string]any{"namespace": "default", "queue": "orders", "message_id": m.MessageID,
		"lease_id": m.LeaseID, "fencing_token": m.FencingToken, "meta_etag": m.MetaETag})
	if ack.status != http.StatusOK || !strings.Contains(string(ack.body), `"acked":true`) {
		t.Fatalf("ack: %d %s", ack.status, ack.body)
	}
	if m.FailureAttempts != 1 || m.Attempts != 2 || m.FencingToken != 2 {
		t.Fatalf("redelivered message %+v", m)
	}
}

func TestQueueTransactions(t *testing.T) {
	e := newEnv(t)
	c := e.client()
	ctx := testCtx(t)
	lease := e.acquire(wire.AcquireRequest{Key: "k"}, nil)
	// An enqueue in a transaction appears when it commits.
	staged, err := c.Enqueue(ctx, wire.EnqueueRequest{Queue: "tx", TxnID: lease.TxnID}, []byte("staged"))
	if err != nil {
		t.Fatal(err)
	}
	if st := e.stats("tx"); st.Staged != 1 || st.Available {
		t.Fatalf("stats before commit %+v", st)
	}
	if r := e.release(lease, false); r.status != http.StatusOK {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	// A dequeue in a transaction is handed back when it rolls back.
	lease = e.acquire(wire.AcquireRequest{Key: "k"}, nil)
	d, err := c.Dequeue(ctx, wire.DequeueRequest{Queue: "tx", Owner: "w", WaitSeconds: wire.BlockNoWait, TxnID: lease.TxnID})
	if err != nil || d.Message.MessageID != staged.MessageID || d.Message.TxnID != lease.TxnID {
		t.Fatalf("transactional dequeue %+v %v", d, err)
	}
	if r := e.release(lease, true); r.status != http.StatusOK {
		t.Fatalf("rollback: %d %s", r.status, r.body)
	}
	d, err = c.Dequeue(ctx, wire.DequeueRequest{Queue: "tx", Owner: "w", WaitSeconds: wire.BlockNoWait})
	if err != nil || d.Message.MessageID != staged.MessageID || d.Message.FailureAttempts != 1 {
		t.Fatalf("after rollback %+v %v", d, err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.stats("tx"); st.Ready != 0 || st.InFlight != 0 || st.Staged != 0 {
		t.Fatalf("stats at the end %+v", st)
	}
}

// A multipart reader cannot tell a part ending in "\r\n", or one that is
// "-" or "--", from the start of the next boundary; a subscriber must still
// get such a delivery at once, not when the next message arrives.
func TestQueueSubscribePayloadLikeABoundary(t *testing.T) {
	for _, payload := range []string{"line\r\n", "-", "--", "x"} {
		e := newEnv(t)
		c := e.client()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		got := make(chan string, 1)
		done := make(chan error, 1)
		go func() {
			done <- c.Subscribe(ctx, wire.DequeueRequest{Queue: "edge", Owner: "sub", WaitSeconds: 10}, func(d *client.Delivery) error {
				got <- string(d.Payload)
				return d.Ack(ctx)
			})
		}()
		testutil.WaitFor(t, 10*time.Second, "the subscriber to wait", func() bool { return e.stats("edge").WaitingConsumers == 1 })
		e.enqueue("edge", payload)
		select {
		case p := <-got:
			if p != payload {
				t.Fatalf("payload %q, want %q", p, payload)
			}
		case err := <-done:
			t.Fatalf("subscription ended: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatalf("the delivery of %q was held back", payload)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("subscribe ended with %v", err)
		}
	}
}

// A subscriber that does not get on with its deliveries is not sent more:
// the stream leases the next message once the subscriber has finished with
// the one it holds (page_size of them, when given), so the others stay
// ready for other consumers instead of waiting, leased, in the
// connection's buffers.
func TestQueueSubscribeLeasesOneDeliveryAtATime(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"a", "b", "c"} {
		e.enqueue("window", p)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	next := e.subscribe(ctx, `{"queue":"window","owner":"sub","wait_seconds":10}`)
	first, p := next()
	if p != "a" {
		t.Fatalf("the stream started with %q", p)
	}
	// The subscriber holds "a": "b" is still there for another consumer.
	if got := e.dequeueOne("window"); string(got.payload) != "b" {
		t.Fatalf("another consumer got %q", got.payload)
	}
	if st := e.stats("window"); st.InFlight != 2 || st.Ready != 1 {
		t.Fatalf("stats while the subscriber holds one delivery %+v", st)
	}
	// Once it acks "a" the stream goes on with "c".
	if r := e.post("/v1/queue/ack", nil, ackBody(first)); r.status != http.StatusOK {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	if _, p := next(); p != "c" {
		t.Fatalf("the stream went on with %q", p)
	}
	cancel()
	testutil.WaitFor(t, 10*time.Second, "the subscription to end on the server", func() bool {
		return e.stats("window").WaitingConsumers == 0
	})
}

// subscribe opens a subscription with body and returns a function that
// reads its next delivery (the message and its payload), failing the test
// when the stream ends or ctx does first.
func (e *env) subscribe(ctx context.Context, body string) func() (*wire.Message, string) {
	t := e.t
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/queue/subscribe", strings.NewReader(body))
	res, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	_, params, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	mr := multipart.NewReader(res.Body, params["boundary"])
	return func() (*wire.Message, string) {
		t.Helper()
		var meta wire.DequeueResponse
		for meta.Message == nil {
			p, err := mr.NextPart()
			if err != nil {
				t.Fatal(err)
			}
			if err := json.NewDecoder(p).Decode(&meta); err != nil {
				t.Fatal(err)
			}
		}
		p, err := mr.NextPart()
		if err != nil {
			t.Fatal(err)
		}
		payload, _ := io.ReadAll(io.LimitReader(p, meta.Message.PayloadBytes))
		return meta.Message, string(payload)
	}
}

// A subscription with page_size 2 that holds two deliveries leases the
// next message as soon as the subscriber finishes either of them, the
// newer one included, not only once the oldest ends.
func TestQueueSubscribeWindowFreesASlotForAnyFinishedDelivery(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"a", "b", "c"} {
		e.enqueue("window2", p)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 10*time.Second)
	defer cancel()
	next := e.subscribe(ctx, `{"queue":"window2","owner":"sub","wait_seconds":10,"page_size":2}`)
	if _, p := next(); p != "a" {
		t.Fatalf("the stream started with %q", p)
	}
	second, p := next()
	if p != "b" {
		t.Fatalf("the second delivery was %q", p)
	}
	if r := e.post("/v1/queue/ack", nil, ackBody(second)); r.status != http.StatusOK {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	// "a" is still leased for its visibility timeout (30 s): "c" must come
	// well before that, before ctx ends the stream.
	if _, p := next(); p != "c" {
		t.Fatalf("the stream went on with %q", p)
	}
}

// A restore of a state in which a subscription's delivery is still held
// does not free the stream's slot: with page_size 1 it leases no second
// message, and the watch of the delivery goes on in the restored state, so
// that finishing it frees the slot.
func TestQueueSubscribeWindowSurvivesARestore(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"a", "b"} {
		e.enqueue("restored", p)
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	next := e.subscribe(ctx, `{"queue":"restored","owner":"sub","wait_seconds":10,"page_size":1,"visibility_timeout_seconds":120}`)
	first, p := next()
	if p != "a" {
		t.Fatalf("the stream started with %q", p)
	}
	backup := e.saveSnapshot() // "a" leased to the stream
	c := testutil.OperatorClient(t, e.url, client.WithRetry(0))
	if _, err := c.RestoreSnapshot(testCtx(t), bytes.NewReader(backup), int64(len(backup)), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a stream that took the restore for the end of "a" leases "b" at once
	if st := e.stats("restored"); st.InFlight != 1 {
		t.Fatalf("a subscription with page_size 1 holds %d deliveries after a restore (stats %+v)", st.InFlight, st)
	}
	if r := e.post("/v1/queue/ack", nil, ackBody(first)); r.status != http.StatusOK {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	if _, p := next(); p != "b" {
		t.Fatalf("after the ack the stream went on with %q", p)
	}
}

// raftlockd_lease_waiters_local counts blocked acquires only: a blocked
// dequeue and a subscription holding a delivery are no lease waiters.
func TestLocalLeaseWaitersCountsOnlyAcquires(t *testing.T) {
	e := newEnv(t)
	e.enqueue("gauge", "a")
	ctx, cancel := context.WithTimeout(testCtx(t), 20*time.Second)
	defer cancel()
	next := e.subscribe(ctx, `{"queue":"gauge","owner":"sub","wait_seconds":10}`)
	next()
	blocked := make(chan resp, 1)
	go func() { blocked <- e.post("/v1/queue/dequeue", nil, `{"queue":"empty","owner":"w","wait_seconds":10}`) }()
	testutil.WaitFor(t, 5*time.Second, "the dequeue to wait", func() bool { return e.stats("empty").WaitingConsumers == 1 })
	if n := e.localWaiters(); n != 0 {
		t.Fatalf("no acquire waits, yet raftlockd_lease_waiters_local is %d", n)
	}
	l := e.acquire(wire.AcquireRequest{Key: "held", Owner: "a", TTLSeconds: 30}, nil)
	granted := make(chan resp, 1)
	go func() {
		granted <- e.post("/v1/acquire", nil, `{"key":"held","owner":"b","ttl_seconds":30,"block_seconds":10}`)
	}()
	testutil.WaitFor(t, 5*time.Second, "the acquire to wait", func() bool { return e.localWaiters() == 1 })
	e.release(l, false)
	if r := <-granted; r.status != http.StatusOK {
		t.Fatalf("the blocked acquire: %d %s", r.status, r.body)
	}
	e.enqueue("empty", "x")
	if r := <-blocked; r.status != http.StatusOK {
		t.Fatalf("the blocked dequeue: %d %s", r.status, r.body)
	}
}

// cutDeliveries answers every dequeue with its payload cut short, as a
// connection that breaks after the delivery's meta part arrived would.
type cutDeliveries struct{ http.RoundTripper }

func (c cutDeliveries) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.RoundTripper.RoundTrip(r)
	if err != nil || !strings.HasPrefix(r.URL.Path, "/v1/queue/dequeue") {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	at := bytes.Index(body, []byte(`name="`+wire.PartPayload+`"`))
	if at < 0 {
		return nil, fmt.Errorf("no payload part in %q", body)
	}
	resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body[:at+100]), errReader{io.ErrUnexpectedEOF}))
	resp.ContentLength = -1
	return resp, nil
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// A dequeue whose answer breaks off after the delivery was leased to it
// hands the message back: the next consumer gets it at once, not when the
// lease runs out, and no attempt was spent on it.
func TestClientHandsBackADeliveryItCouldNotRead(t *testing.T) {
	e := newEnv(t)
	sent := e.enqueue("cut", strings.Repeat("p", 4096))
	hc := *e.hc
	hc.Transport = cutDeliveries{e.hc.Transport}
	c, err := client.New(e.url, client.WithRetry(0), client.WithHTTPClient(&hc))
	if err != nil {
		t.Fatal(err)
	}
	for _, withState := range []bool{false, true} {
		dequeue := c.Dequeue
		if withState {
			dequeue = c.DequeueWithState
		}
		_, err = dequeue(testCtx(t), wire.DequeueRequest{Queue: "cut", Owner: "w", WaitSeconds: wire.BlockNoWait})
		if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "handed back") {
			t.Fatalf("with state %v: dequeue answered %v", withState, err)
		}
		next := e.dequeueOne("cut")
		if m := next.meta.Message; m.MessageID != sent.MessageID || m.FailureAttempts != 0 || string(next.payload) != strings.Repeat("p", 4096) {
			t.Fatalf("with state %v: the next consumer got %+v", withState, m)
		}
		if r := e.post("/v1/queue/nack", nil, map[string]any{"queue": "cut", "message_id": next.meta.Message.MessageID,
			"lease_id": next.meta.Message.LeaseID, "fencing_token": next.meta.Message.FencingToken,
			"meta_etag": next.meta.Message.MetaETag, "intent": wire.NackIntentDefer}); r.status != http.StatusOK {
			t.Fatalf("nack: %d %s", r.status, r.body)
		}
	}
}

// A subscription holds at most 100 unfinished deliveries, whatever
// page_size it asks for: with wait_seconds -1 its stream ends there, and
// the rest stays ready for other consumers.
func TestQueueSubscribeHoldsAtMostAHundredDeliveries(t *testing.T) {
	e := newEnv(t)
	for i := range 101 {
		e.enqueue("wide", strconv.Itoa(i))
	}
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPost, e.url+"/v1/queue/subscribe",
		strings.NewReader(`{"queue":"wide","owner":"sub","wait_seconds":-1,"page_size":1000}`))
	res, err := e.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	_, params, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	mr := multipart.NewReader(res.Body, params["boundary"])
	delivered := 0
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.FormName() == wire.PartMeta {
			var meta wire.DequeueResponse
			if json.NewDecoder(p).Decode(&meta) == nil && meta.Message != nil {
				delivered++
			}
		}
	}
	if st := e.stats("wide"); delivered != 100 || st.Ready != 1 || st.InFlight != 100 {
		t.Fatalf("the stream delivered %d messages (stats %+v), want 100 and one left ready", delivered, st)
	}
}
