package demo

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

var kebabCase = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

func TestRunbooks(t *testing.T) {
	docs, err := loadRunbooks(runbookFS)
	if err != nil {
		t.Fatalf("embedded runbooks: %v", err)
	}
	if len(docs) < 45 || len(docs) > 60 {
		t.Errorf("%d runbooks, want about 50", len(docs))
	}
	seen := map[string]bool{}
	for _, d := range docs {
		if seen[d.ID] {
			t.Errorf("duplicate id %q", d.ID)
		}
		seen[d.ID] = true
		if !kebabCase.MatchString(d.ID) {
			t.Errorf("id %q is not kebab-case", d.ID)
		}
		if !strings.HasPrefix(d.Title, "Runbook: ") && !strings.HasPrefix(d.Title, "Policy: ") {
			t.Errorf("%s: title %q should start with Runbook: or Policy:", d.ID, d.Title)
		}
		if paragraphs := strings.Count(strings.TrimSpace(d.Body), "\n\n") + 1; paragraphs < 4 {
			t.Errorf("%s: body has %d blocks, want several paragraphs or steps", d.ID, paragraphs)
		}
		if len(d.Tags) == 0 {
			t.Errorf("%s: no tags", d.ID)
		}
		for _, tag := range d.Tags {
			if tag != strings.ToLower(tag) {
				t.Errorf("%s: tag %q is not lowercase", d.ID, tag)
			}
		}
		for _, addr := range regexp.MustCompile(`[\w.+-]+@[\w.-]+\w`).FindAllString(d.Body, -1) {
			if !strings.HasSuffix(addr, "@"+AllowedDomains[0]) {
				t.Errorf("%s: address %s is outside the allowed domain", d.ID, addr)
			}
		}
	}
	if !reflect.DeepEqual(Runbooks(), docs) {
		t.Error("Runbooks() differs from the embedded files")
	}
}

func TestRunbooksFailedPaymentRetries(t *testing.T) {
	var doc *Doc
	docs := Runbooks()
	for i := range docs {
		if docs[i].ID == "runbook-failed-payment-retries" {
			doc = &docs[i]
		}
	}
	if doc == nil {
		t.Fatal("runbook-failed-payment-retries is missing")
	}
	if doc.Title != "Runbook: Failed payment retries" {
		t.Errorf("title = %q", doc.Title)
	}
	for _, want := range []string{"retry schedule", "dunning", Finance, AccountTeam, "failed"} {
		if !strings.Contains(strings.ToLower(doc.Body), strings.ToLower(want)) {
			t.Errorf("body does not mention %q", want)
		}
	}
}

func TestRunbooksReturnsFreshSlice(t *testing.T) {
	first := Runbooks()
	first[0].Title = "changed"
	first[0].Tags[0] = "changed"
	if second := Runbooks(); second[0].Title == "changed" || second[0].Tags[0] == "changed" {
		t.Error("Runbooks shares memory between calls")
	}
}

func TestParseDoc(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       Doc
		wantErr    string
	}{
		{
			name: "ok",
			text: "---\ntitle: Runbook: Thing\ntags: a, b,\n---\n\nBody.\n\nMore.\n",
			want: Doc{ID: "x", Title: "Runbook: Thing", Tags: []string{"a", "b"}, Body: "Body.\n\nMore.\n"},
		},
		{
			name: "crlf",
			text: "---\r\ntitle: T\r\n---\r\nBody\r\n",
			want: Doc{ID: "x", Title: "T", Body: "Body\n"},
		},
		{name: "no front matter", text: "# Title\n", wantErr: "no front matter"},
		{name: "unclosed", text: "---\ntitle: T\n", wantErr: "not closed"},
		{name: "no title", text: "---\ntags: a\n---\nBody\n", wantErr: "no title"},
		{name: "unknown key", text: "---\ntitle: T\nowner: me\n---\nBody\n", wantErr: "unknown front matter key"},
		{name: "not key value", text: "---\ntitle: T\njust words\n---\nBody\n", wantErr: "not key: value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDoc("x", tc.text)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

func TestLoadRunbooksNamesBadFile(t *testing.T) {
	fsys := fstest.MapFS{"runbooks/broken.md": {Data: []byte("no front matter")}}
	if _, err := loadRunbooks(fsys); err == nil || !strings.Contains(err.Error(), "runbooks/broken.md") {
		t.Errorf("err = %v, want one naming runbooks/broken.md", err)
	}
}
