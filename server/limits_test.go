package server_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/server"
)

// startLimited starts a node whose API server hook adjusts (shorter
// timeouts), and waits until it leads.
func startLimited(t *testing.T, cfg config.Server, hook func(*http.Server)) *server.Server {
	t.Helper()
	srv, err := server.Start(cfg, testutil.Logger(t), server.WithHTTPServer(hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeServer(t, srv) })
	testutil.WaitFor(t, 10*time.Second, "leader", srv.Node().IsLeader)
	return srv
}

func closeServer(t *testing.T, srv *server.Server) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Close(t.Context()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("close did not finish")
	}
}

func plainConfig(t *testing.T) config.Server {
	cfg := testutil.Config(t, t.TempDir())
	cfg.DisableMTLS = true
	return cfg
}

// waitClosed reads from conn until the server closes it; it fails when the
// connection is still open after d.
func waitClosed(t *testing.T, conn net.Conn, d time.Duration) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %s", d)
	}
}

// trickle writes one line to conn every interval until conn fails or done
// is closed.
func trickle(conn net.Conn, interval time.Duration, done <-chan struct{}, line func(i int) string) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if _, err := io.WriteString(conn, line(i)); err != nil {
			return
		}
	}
}

// A client that sends its headers a line at a time, never finishing them
// (slowloris), is cut off after the read-header timeout.
func TestSlowHeadersAreCutOff(t *testing.T) {
	srv := startLimited(t, plainConfig(t), func(s *http.Server) { s.ReadHeaderTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: raftlockd\r\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer close(done)
	go trickle(conn, 50*time.Millisecond, done, func(i int) string { return fmt.Sprintf("X-Slow-%d: x\r\n", i) })
	start := time.Now()
	waitClosed(t, conn, 10*time.Second)
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Fatalf("cut off after %s, before the timeout", took)
	}
}

// The same holds before the TLS handshake: a client that connects and
// sends nothing does not keep the connection.
func TestSilentTLSClientIsCutOff(t *testing.T) {
	srv := startLimited(t, testutil.Config(t, t.TempDir()), func(s *http.Server) { s.ReadHeaderTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitClosed(t, conn, 10*time.Second)
}

// A body sent a byte at a time is cut off after the read timeout, and the
// request is refused with a coded error if an answer gets through at all.
func TestSlowBodyIsCutOff(t *testing.T) {
	srv := startLimited(t, plainConfig(t), func(s *http.Server) { s.ReadTimeout = 500 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/release HTTP/1.1\r\nHost: raftlockd\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer close(done)
	go trickle(conn, 50*time.Millisecond, done, func(int) string { return " " })
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		defer resp.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		if derr := json.NewDecoder(resp.Body).Decode(&e); derr != nil || resp.StatusCode != http.StatusBadRequest || e.Error != "invalid_body" {
			t.Fatalf("slow body answered %d %q (%v)", resp.StatusCode, e.Error, derr)
		}
	} else {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the server kept waiting for a slow body")
		}
	}
	waitClosed(t, conn, 10*time.Second)
}

// An idle keep-alive connection is closed after the idle timeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	srv := startLimited(t, plainConfig(t), func(s *http.Server) { s.IdleTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: raftlockd\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	waitClosed(t, conn, 10*time.Second)
}

// Headers beyond the server's limit are refused with 431, over plain HTTP
// and over mTLS, with the default limits.
func TestOversizedHeaderIs431(t *testing.T) {
	var limits struct {
		MaxHeaderBytes                                            int
		ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	}
	srv := startLimited(t, testutil.Config(t, t.TempDir()), func(s *http.Server) {
		limits.MaxHeaderBytes, limits.ReadHeaderTimeout, limits.ReadTimeout = s.MaxHeaderBytes, s.ReadHeaderTimeout, s.ReadTimeout
		limits.WriteTimeout, limits.IdleTimeout = s.WriteTimeout, s.IdleTimeout
	})
	plain := startLimited(t, plainConfig(t), nil)
	if limits.MaxHeaderBytes <= 0 || limits.MaxHeaderBytes > 64<<10 || limits.ReadHeaderTimeout <= 0 || limits.ReadTimeout <= 0 ||
		limits.WriteTimeout <= 0 || limits.IdleTimeout <= 0 {
		t.Fatalf("unbounded API server: max header bytes %d, timeouts header %s read %s write %s idle %s", limits.MaxHeaderBytes,
			limits.ReadHeaderTimeout, limits.ReadTimeout, limits.WriteTimeout, limits.IdleTimeout)
	}
	for _, c := range []struct {
		url    string
		client *http.Client
	}{{srv.URL(), testutil.HTTPClient(t, nil)}, {plain.URL(), &http.Client{Transport: &http.Transport{}}}} {
		req, err := http.NewRequest(http.MethodGet, c.url+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Padding", strings.Repeat("p", 128<<10))
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("%s: oversized header answered %d", c.url, resp.StatusCode)
		}
		c.client.CloseIdleConnections()
	}
}

// Waiting on the server (a blocked acquire, a dequeue) may last longer
// than the read timeout: the request runs to the end of its wait instead of
// being cancelled when the timeout strikes.
func TestLongPollsOutlastTheReadTimeout(t *testing.T) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.AcquireBlock = 5 * time.Second
	srv := startLimited(t, cfg, func(s *http.Server) { s.ReadTimeout = 300 * time.Millisecond })
	hc := testutil.HTTPClient(t, nil)
	defer hc.CloseIdleConnections()
	post := func(path, body string) (int, string, time.Duration) {
		t.Helper()
		start := time.Now()
		resp, err := hc.Post(srv.URL()+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error, time.Since(start)
	}
	if status, code, _ := post("/v1/acquire", `{"key":"held","owner":"a","ttl_seconds":60}`); status != http.StatusOK {
		t.Fatalf("acquire: %d %s", status, code)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/acquire", `{"key":"held","owner":"b","ttl_seconds":60,"block_seconds":2}`},
		{"/v1/queue/dequeue", `{"queue":"empty","owner":"b","wait_seconds":2}`},
	} {
		status, code, took := post(c.path, c.body)
		if status != http.StatusConflict || code != "waiting" || took < 1500*time.Millisecond {
			t.Fatalf("%s: %d %q after %s, want 409 waiting after its 2s wait", c.path, status, code, took)
		}
	}
}
