package dataplane

import (
	"errors"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// kindConstants type-checks the package's source (not its tests) and returns its constants of
// each kind type, by value. The imports are not resolved: a kind constant needs none, and the
// checker records every constant it could evaluate despite the errors elsewhere.
func kindConstants(t *testing.T) map[string]map[uint64][]string {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		src, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, n, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: noImports{}, Error: func(error) {}}
	conf.Check("dataplane", fset, files, info) // errors: the unresolved imports
	out := map[string]map[uint64][]string{"MatchKind": {}, "ActionKind": {}, "SetKind": {}}
	for id, obj := range info.Defs {
		c, ok := obj.(*types.Const)
		if !ok || c.Parent() != c.Pkg().Scope() {
			continue
		}
		named, ok := c.Type().(*types.Named)
		if !ok {
			continue
		}
		byValue, ok := out[named.Obj().Name()]
		if !ok {
			continue
		}
		v, exact := constant.Uint64Val(c.Val())
		if !exact {
			t.Fatalf("%s: constant %s has no value the checker could compute", fset.Position(id.Pos()), id.Name)
		}
		byValue[v] = append(byValue[v], id.Name)
	}
	return out
}

// noImports resolves no import (see kindConstants).
type noImports struct{}

func (noImports) Import(path string) (*types.Package, error) {
	return nil, errors.New("not resolved")
}

// TestKindDescriptorsComplete: every match, action and set kind the package declares has exactly one
// descriptor (kinds.go) with everything each consumer needs, no two kinds share a number, and no
// descriptor is registered for a number no constant names. This is what makes kinds.go's recipe for
// a new kind safe: a constant without a complete descriptor fails here, before any consumer meets it.
func TestKindDescriptorsComplete(t *testing.T) {
	consts := kindConstants(t)
	for typ, byValue := range consts {
		if len(byValue) == 0 {
			t.Errorf("no %s constants found: the test no longer sees the package's declarations", typ)
		}
		for v, names := range byValue {
			if len(names) > 1 {
				t.Errorf("%s %d is declared as %v: two kinds share a number", typ, v, names)
			}
		}
	}
	for v, names := range consts["MatchKind"] {
		d := matchKindDescs[MatchKind(v)]
		switch {
		case d == nil:
			t.Errorf("match kind %s (%d) has no descriptor", names[0], v)
		case d.encode == nil || d.text == nil || d.hint == nil || d.trace == nil:
			t.Errorf("match kind %s (%d): descriptor lacks encode, text, hint or trace: %+v", names[0], v, *d)
		}
	}
	for v, names := range consts["ActionKind"] {
		d := actionKindDescs[ActionKind(v)]
		switch {
		case d == nil:
			t.Errorf("action kind %s (%d) has no descriptor", names[0], v)
		case d.encode == nil || d.text == nil || d.hint == nil || d.trace == nil:
			t.Errorf("action kind %s (%d): descriptor lacks encode, text, hint or trace", names[0], v)
		}
	}
	for v, names := range consts["SetKind"] {
		d := setKindDescs[SetKind(v)]
		switch {
		case d == nil:
			t.Errorf("set kind %s (%d) has no descriptor", names[0], v)
		case d.decl == nil || d.nftSet == nil:
			t.Errorf("set kind %s (%d): descriptor lacks decl or nftSet", names[0], v)
		case d.dynamic && d.element == nil:
			t.Errorf("set kind %s (%d): a dynamic set needs element, to purge by key", names[0], v)
		case !d.dynamic && !d.timeout && (d.element == nil || d.text == nil || d.traceKey == nil || d.decode == nil && !d.intervals):
			t.Errorf("set kind %s (%d): descriptor lacks element, text, traceKey or decode", names[0], v)
		}
	}
	for k := range matchKindDescs {
		if consts["MatchKind"][uint64(k)] == nil {
			t.Errorf("match kind %d has a descriptor but no constant", k)
		}
	}
	for k := range actionKindDescs {
		if consts["ActionKind"][uint64(k)] == nil {
			t.Errorf("action kind %d has a descriptor but no constant", k)
		}
	}
	for k := range setKindDescs {
		if consts["SetKind"][uint64(k)] == nil {
			t.Errorf("set kind %d has a descriptor but no constant", k)
		}
	}
	// The decoder's candidates are every kind, in ascending order.
	for i := 1; i < len(actionKinds); i++ {
		if actionKinds[i-1] >= actionKinds[i] {
			t.Errorf("actionKinds not ascending at %d: %v", i, actionKinds)
		}
	}
	if len(matchKinds) != len(matchKindDescs) || len(actionKinds) != len(actionKindDescs) || len(allSetKinds) != len(setKindDescs) {
		t.Errorf("the decoder's candidate lists (%d, %d, %d) differ from the descriptors (%d, %d, %d)",
			len(matchKinds), len(actionKinds), len(allSetKinds), len(matchKindDescs), len(actionKindDescs), len(setKindDescs))
	}
}

// An unknown kind is an error in every consumer, never a guess.
func TestUnknownKindsFail(t *testing.T) {
	f := &Flat{Family: 4, Table: "t", Chains: map[string]*Chain{}, Sets: map[string]*Set{"s": {Name: "s", Kind: 99}}}
	fam, _ := familyOf(f.Family)
	if _, err := matchText(f, fam, Match{Kind: 99}); err == nil || !strings.Contains(err.Error(), "unknown match kind 99") {
		t.Errorf("matchText: %v", err)
	}
	if _, err := actionText(f, fam, Action{Kind: 99}); err == nil || !strings.Contains(err.Error(), "unknown action kind 99") {
		t.Errorf("actionText: %v", err)
	}
	if _, _, err := setDecl(fam, f.Sets["s"]); err == nil || !strings.Contains(err.Error(), "unknown set kind 99") {
		t.Errorf("setDecl: %v", err)
	}
	e := &encoder{f: 4}
	if _, err := e.match(Match{Kind: 99}); err == nil || !strings.Contains(err.Error(), "unknown match kind 99") {
		t.Errorf("encoder.match: %v", err)
	}
	if _, err := e.action(Action{Kind: 99}); err == nil || !strings.Contains(err.Error(), "unknown action kind 99") {
		t.Errorf("encoder.action: %v", err)
	}
	if _, err := e.nftSet(f.Sets["s"]); err == nil || !strings.Contains(err.Error(), "unknown kind 99") {
		t.Errorf("encoder.nftSet: %v", err)
	}
	if _, err := decodeElement(f.Sets["s"], 4, KernelElement{}); err == nil || !strings.Contains(err.Error(), "set kind 99 has no element decoder") {
		t.Errorf("decodeElement: %v", err)
	}
	if _, err := keyOf(99, Element{}); err == nil || !strings.Contains(err.Error(), "unknown set kind 99") {
		t.Errorf("keyOf: %v", err)
	}
}

// Session affinity's kinds trace through their descriptors (what the trace does with them is the
// node's Service semantics: proxy's TestTraceAffinitySteps).
func TestAffinityKindsTrace(t *testing.T) {
	for _, k := range []ActionKind{ActAffinityDNAT, ActAffinityRefresh, ActAffinityRecall} {
		if d := actionKindDescs[k]; d == nil || d.trace == nil {
			t.Errorf("action kind %d has no trace in its descriptor", k)
		}
	}
}
