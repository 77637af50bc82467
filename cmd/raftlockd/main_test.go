package main

import (
	"os"
	"testing"

	"github.com/raftlockd/raftlockd/internal/testutil"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinary()
	os.Exit(code)
}
