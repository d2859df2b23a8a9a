// Command hello is the build that the Tekton scenarios compile in a step:
// a small CLI whose dependencies (pflag, net/http, encoding/json,
// text/template) make a cold Go build cache cost tens of seconds and a warm
// one a link.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"text/template"

	flag "github.com/spf13/pflag"
)

func main() {
	name := flag.String("name", "cached build", "who says hello")
	flag.Parse()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"greeting": "hello from a " + *name})
	}))
	defer srv.Close()
	if err := greet(os.Stdout, srv.URL); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func greet(w io.Writer, url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	return template.Must(template.New("").Parse("{{.greeting}}\n")).Execute(w, body)
}
