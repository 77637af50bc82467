package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/raftlockd/raftlockd/internal/testutil"
)

func TestMain(m *testing.M) {
	var err error
	if dataHome, err = os.MkdirTemp("", "raftlockd-cli-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testutil.RemoveBinary()
	os.RemoveAll(dataHome)
	os.Exit(code)
}
