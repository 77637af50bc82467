package server

import (
	"errors"
	"net"

	"github.com/raftlockd/raftlockd/api"
	"github.com/raftlockd/raftlockd/errcode"
)

// errPlainHTTP ends the TLS handshake of a connection that sent plain HTTP.
var errPlainHTTP = errors.New("plain HTTP request on the TLS port")

// plainHTTPGuard wraps the raw listener under the TLS one. A client that
// speaks plain HTTP to the TLS port gets the API's JSON error (400
// tls_required) rather than net/http's text reply.
type plainHTTPGuard struct{ net.Listener }

func (l plainHTTPGuard) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &plainHTTPConn{Conn: c}, nil
}

// plainHTTPConn looks at the first byte a client sends. A TLS client opens
// with a handshake record (0x16); a plain-HTTP one with a method name in
// capitals. Only the TLS handshake reads the raw connection, from one
// goroutine, so checked needs no lock.
type plainHTTPConn struct {
	net.Conn
	checked bool
}

func (c *plainHTTPConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.checked || n == 0 {
		return n, err
	}
	c.checked = true
	if b[0] < 'A' || b[0] > 'Z' {
		return n, err
	}
	_ = api.WriteRawError(c.Conn, errcode.TLSRequired.With("this port speaks TLS: use https://"))
	return 0, errPlainHTTP
}
