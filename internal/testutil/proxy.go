package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback in front of one address. Tests put it
// on the link between islands: Hold keeps new and open connections from
// delivering anything (the link stalls), Release drops every held
// connection and lets traffic flow again.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	done    bool
	hold    bool
	held    int
	conns   map[net.Conn]struct{}
	resumed chan struct{}
	wg      sync.WaitGroup
}

// NewProxy listens on a free loopback address and forwards to target until
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, resumed: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's address as an https URL: TLS passes through the
// proxy to the server behind it, whose certificate must name the proxy's
// address (the test process's loopback address, see testaddr).
func (p *Proxy) URL() string { return "https://" + p.ln.Addr().String() }

// Hold stalls the link: bytes sent through it are not delivered.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = true
}

// Held reports how many connections carried traffic into a stalled link.
func (p *Proxy) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Release closes every connection that is open now (what they carried is
// lost) and lets new connections through.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	if p.hold {
		p.hold = false
		close(p.resumed)
		p.resumed = make(chan struct{})
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.Release()
	p.wg.Wait()
}

// track registers an open connection; after close it refuses.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.pipe(in)
		}()
	}
}

func (p *Proxy) pipe(in net.Conn) {
	if !p.track(in) {
		in.Close()
		return
	}
	defer p.untrack(in)
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(out) {
		out.Close()
		return
	}
	defer p.untrack(out)
	var wg sync.WaitGroup
	copyDir := func(dst, src net.Conn) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				hold, resumed := p.hold, p.resumed
				if hold {
					p.held++
				}
				p.mu.Unlock()
				if hold {
					// Stalled: wait for Release, which closes this
					// connection; nothing read here is delivered.
					<-resumed
					return
				}
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				if err != io.EOF {
					return
				}
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return
			}
		}
	}
	wg.Add(2)
	go copyDir(out, in)
	go copyDir(in, out)
	wg.Wait()
}
