package keyreload

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// readLines reads a key file of one key a line, refusing an empty one.
func readLines(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, l := range strings.Fields(string(b)) {
		keys = append(keys, []byte(l))
	}
	if len(keys) == 0 {
		return nil, errors.New("no key")
	}
	return keys, nil
}

// TestReloaderOnce: a changed file is applied and logged; the same keys are not applied again; a
// missing or broken file and a refused key keep the previous keys, logged as failures.
func TestReloaderOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	var log bytes.Buffer
	var applied [][][]byte
	refuse := false
	r := Reloader{Path: path, Read: readLines,
		Apply: func(k [][]byte) error {
			if refuse {
				return errors.New("refused")
			}
			applied = append(applied, k)
			return nil
		},
		Log:    hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Info}),
		Failed: "keeping the previous test keys", Reloaded: "test keys reloaded"}
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keys := [][]byte{[]byte("a")}
	step := func(name string, wantChanged bool, wantLog string) {
		t.Helper()
		log.Reset()
		next, changed := r.once(keys)
		if changed != wantChanged || !strings.Contains(log.String(), wantLog) {
			t.Errorf("%s: changed %v, log %q; want %v, %q", name, changed, log.String(), wantChanged, wantLog)
		}
		keys = next
	}
	step("missing file", false, "keeping the previous test keys")
	write("a\n")
	step("same keys", false, "")
	write("b\na\n")
	step("rotation", true, "test keys reloaded: keys=2")
	write("\n")
	step("empty file", false, "keeping the previous test keys")
	write("c\n")
	refuse = true
	step("refused", false, "keeping the previous test keys: err=refused")
	if len(applied) != 1 || len(keys) != 2 || string(keys[0]) != "b" {
		t.Errorf("applied %q, keys in use %q; want one rotation to [b a]", applied, keys)
	}
}

// TestReloaderRun: Run applies a change on its period and returns when ctx ends.
func TestReloaderRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("new\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan [][]byte, 1)
	r := Reloader{Path: path, Period: time.Millisecond, Read: readLines, Log: hclog.NewNullLogger(),
		Apply: func(k [][]byte) error {
			select {
			case got <- k:
			default:
			}
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx, [][]byte{[]byte("old")}) }()
	if k := <-got; len(k) != 1 || string(k[0]) != "new" {
		t.Errorf("applied %q, want [new]", k)
	}
	cancel()
	wg.Wait()
}
