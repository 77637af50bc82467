package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/wire"
)

// TestStatusPage proves, in a headless Chromium, that the embedded status
// page (/ui/status) shows the node's chain height as it loads, then shows
// a block applied afterwards (height and hash) on its own next poll,
// without a reload, and that it loads nothing from any other host.
func TestStatusPage(t *testing.T) {
	browser := chromium(t)
	c := Start(t, 1, WithoutTLS())
	c.WaitLeader(10 * time.Second)
	base, err := url.Parse(c.URL(0))
	if err != nil {
		t.Fatal(err)
	}

	// The page as served: nothing it references lives on another host.
	resp, err := c.HTTPClient("ui").Get(base.String() + "/ui/status")
	if err != nil {
		t.Fatal(err)
	}
	html, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if m := externalRef.Find(html); m != nil {
		t.Errorf("the status page references another host: %s", m)
	}

	// Deferred, so that the browser and every chromedp goroutine end before
	// the test returns (TestMain checks for leaked goroutines); each cancel
	// waits for what it started.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU)...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	defer cancelTab()
	// Start the browser with a context that has no deadline: the first
	// Run binds the browser's life to its context.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", browser, err)
	}

	// Every request the page makes, recorded as the browser reports it.
	var (
		mu       sync.Mutex
		requests []string
	)
	if err := chromedp.Listen(ctx, func(ev any) {
		if ev, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			requests = append(requests, ev.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}

	step, cancelStep := context.WithTimeout(ctx, 30*time.Second)
	defer cancelStep()
	if err := chromedp.Do(step,
		chromedp.Navigate(base.String()+"/ui/status?refresh=0.2"),
		chromedp.WaitVisible(chromedp.ID("height")),
	); err != nil {
		t.Fatalf("open the status page: %v", err)
	}
	waitText(ctx, t, "height", "0", false)

	block := wire.UTXOBlockRequest{
		Height:   1,
		Hash:     chaingen.Hex("ui", "block 1"),
		PrevHash: chaingen.Hex("ui", "genesis"),
		Txs: []wire.UTXOBlockTx{{
			TxID:     chaingen.Hex("ui", "coinbase 1"),
			Coinbase: true,
			Outputs:  []wire.UTXOOutput{{Vout: 0, UTXOHash: chaingen.Hex("ui", "coinbase 1", "0"), Satoshis: 5000000000}},
		}},
	}
	if _, err := c.Client(0).UTXOApplyBlock(step, block); err != nil {
		t.Fatalf("apply block 1: %v", err)
	}
	// The same page, not reloaded, picks the block up on a later poll.
	waitText(ctx, t, "height", "1", false)
	waitText(ctx, t, "tip", block.Hash, true)

	mu.Lock()
	defer mu.Unlock()
	polls := 0
	for _, raw := range requests {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != base.Scheme || u.Host != base.Host {
			t.Errorf("the status page requested %q: only %s is expected", raw, base)
			continue
		}
		if u.Path == "/v1/utxo/status" {
			polls++
		}
	}
	if polls < 2 {
		t.Errorf("the status page polled /v1/utxo/status %d times, want at least 2 (requests: %q)", polls, requests)
	}
}

// externalRef finds a reference to a resource by absolute or
// scheme-relative URL in an HTML page: an attribute, a CSS url() or
// @import, or a fetch.
var externalRef = regexp.MustCompile(`(?i)((src|href|action|data|poster|srcset)\s*=\s*["']?|url\(\s*["']?|@import\s+["']|fetch\(\s*["'])(https?:)?//`)

// waitText waits until the text of the element with the id equals want
// (or, with contains, contains it), failing the test with what the page
// shows after 20 seconds.
func waitText(ctx context.Context, t *testing.T, id, want string, contains bool) {
	t.Helper()
	expr := fmt.Sprintf(`document.getElementById(%s).textContent === %s`, strconv.Quote(id), strconv.Quote(want))
	if contains {
		expr = fmt.Sprintf(`document.getElementById(%s).textContent.includes(%s)`, strconv.Quote(id), strconv.Quote(want))
	}
	wctx, cancel := context.WithTimeout(ctx, 25*time.Second)
	defer cancel()
	_, err := chromedp.Run(wctx, chromedp.Poll[bool](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
	if err == nil {
		return
	}
	// What the page shows instead, for the failure message.
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	shown, _ := chromedp.Run(sctx, chromedp.Evaluate[string](fmt.Sprintf(
		`"#%[1]s=" + JSON.stringify(document.getElementById(%[2]s).textContent) + ", #error=" + JSON.stringify(document.getElementById("error").textContent)`,
		id, strconv.Quote(id))))
	if errors.Is(err, chromedp.ErrPollingTimeout) {
		err = fmt.Errorf("20s passed: %w", err)
	}
	t.Fatalf("wait for #%s to show %q: %v; the page shows %s", id, want, err, shown)
}

// chromium finds a Chromium or Chrome binary, or skips the test (fails it
// when RAFTLOCKD_REQUIRE_CHROMIUM is set, as in CI).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium, chromium-browser or google-chrome on PATH: install Debian's chromium package (apt-get install chromium)"
	if os.Getenv("RAFTLOCKD_REQUIRE_CHROMIUM") != "" {
		t.Fatal(msg + "; RAFTLOCKD_REQUIRE_CHROMIUM is set")
	}
	t.Skip(msg)
	return ""
}
