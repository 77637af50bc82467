// Package lockedbuf holds a buffer that some goroutines write while others
// read it: the log of a child process or of a node under test. It has no
// dependencies inside the module, so that every package's tests, the
// cluster package's own included, can use it.
package lockedbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writes and reads.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Contains reports whether what was written so far contains s.
func (b *Buffer) Contains(s string) bool { return strings.Contains(b.String(), s) }
