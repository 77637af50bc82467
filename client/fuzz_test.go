package client

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"net/textproto"
	"reflect"
	"runtime"
	"strconv"
	"testing"
	"testing/iotest"

	"github.com/raftlockd/raftlockd/wire"
)

// deliveryBody writes deliveries the way the server does: per delivery a
// meta part, a payload part with its length and, withState, a state part.
func deliveryBody(t testing.TB, boundary string, withState bool, payloads ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := mw.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	part := func(h textproto.MIMEHeader, body string) {
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(w, body)
	}
	for i, p := range payloads {
		part(textproto.MIMEHeader{"Content-Disposition": {`form-data; name="meta"`}, "Content-Type": {"application/json"}},
			`{"message":{"namespace":"default","queue":"q","message_id":"m`+strconv.Itoa(i)+`","lease_id":"l","fencing_token":1}}`+"\n")
		part(textproto.MIMEHeader{"Content-Disposition": {`form-data; name="payload"`}, "Content-Length": {strconv.Itoa(len(p))}}, p)
		if withState {
			part(textproto.MIMEHeader{"Content-Disposition": {`form-data; name="state"`}, "Content-Length": {"7"},
				wire.HeaderKeyVersion: {"3"}, wire.HeaderETag: {`"e3"`}}, `{"s":1}`)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readDeliveries reads every delivery of body, at most limit of them.
func readDeliveries(r io.Reader, boundary string, withState bool, limit int) ([]*Delivery, error) {
	dr := &deliveryReader{mr: multipart.NewReader(r, boundary), withState: withState}
	var out []*Delivery
	for len(out) < limit {
		d, err := dr.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// FuzzDeliveryStream feeds arbitrary multipart answers to the reader of
// dequeue and subscribe answers: nothing panics, no payload or state is
// larger than the answer, and the deliveries read do not depend on how the
// answer arrives (all at once or a byte at a time, as a stream does).
func FuzzDeliveryStream(f *testing.F) {
	f.Add("b1", deliveryBody(f, "b1", false, "hello"), false)
	f.Add("b1", deliveryBody(f, "b1", false, "one", "", "three\r\n"), false)
	f.Add("x-boundary", deliveryBody(f, "x-boundary", true, "with state"), true)
	f.Add("b1", []byte("--b1\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{}\n\r\n--b1--\r\n"), false)
	f.Add("b1", []byte("--b1\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"message\":{\"queue\":\"q\"}}\r\n"+
		"--b1\r\nContent-Disposition: form-data; name=\"payload\"\r\nContent-Length: 1073741824\r\n\r\nshort\r\n--b1--\r\n"), false)
	f.Add("b1", []byte("--b1\r\nContent-Disposition: form-data; name=\"state\"\r\n\r\n{}\r\n--b1--\r\n"), true)
	f.Add("b1", []byte("--b1\r\n"), false)
	f.Fuzz(func(t *testing.T, boundary string, body []byte, withState bool) {
		const limit = 64
		all, errAll := readDeliveries(bytes.NewReader(body), boundary, withState, limit)
		bytewise, errBytewise := readDeliveries(iotest.OneByteReader(bytes.NewReader(body)), boundary, withState, limit)
		if (errAll == nil) != (errBytewise == nil) || !reflect.DeepEqual(all, bytewise) {
			t.Fatalf("read at once: %d deliveries (%v); a byte at a time: %d (%v)", len(all), errAll, len(bytewise), errBytewise)
		}
		for _, d := range all {
			if len(d.Payload) > len(body) || (d.State != nil && len(d.State.Body) > len(body)) {
				t.Fatalf("delivery larger than the answer: payload %d bytes of %d", len(d.Payload), len(body))
			}
		}
	})
}

// A part's Content-Length is the server's word, not an allocation size: a
// broken or hostile answer claiming a gigabyte costs what it carries.
func TestDeliveryPartLengthIsNotTrusted(t *testing.T) {
	body := []byte("--b1\r\nContent-Disposition: form-data; name=\"meta\"\r\n\r\n{\"message\":{\"queue\":\"q\"}}\r\n" +
		"--b1\r\nContent-Disposition: form-data; name=\"payload\"\r\nContent-Length: 1073741824\r\n\r\nshort\r\n--b1--\r\n")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readDeliveries(bytes.NewReader(body), "b1", false, 1)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a payload shorter than its Content-Length was accepted")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("reading a 5-byte payload allocated %d bytes", grew)
	}
}

func TestDeliveryStreamReadsWhatTheServerWrites(t *testing.T) {
	body := deliveryBody(t, "b1", true, "one", "", "three\r\n")
	got, err := readDeliveries(iotest.OneByteReader(bytes.NewReader(body)), "b1", true, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("%d deliveries, %v", len(got), err)
	}
	if string(got[2].Payload) != "three\r\n" || got[2].State == nil || got[2].State.Version != 3 || got[2].State.ETag != "e3" ||
		!got[2].State.Exists || string(got[2].State.Body) != `{"s":1}` {
		t.Fatalf("third delivery: %+v payload %q state %+v", got[2].Message, got[2].Payload, got[2].State)
	}
}
