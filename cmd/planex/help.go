package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// useFlagHelp makes help list flags like pflag did before v1.1: a boolean
// flag is "--json", not "--json[=true|false]" (it still accepts
// --json=false).
func useFlagHelp(root *cobra.Command) {
	cobra.AddTemplateFunc("flagUsages", flagUsages)
	t := root.UsageTemplate()
	t = strings.ReplaceAll(t, ".LocalFlags.FlagUsages", "flagUsages .LocalFlags")
	t = strings.ReplaceAll(t, ".InheritedFlags.FlagUsages", "flagUsages .InheritedFlags")
	root.SetUsageTemplate(t)
}

// devStackFlag annotates the flags of a client command (run, eval) that
// configure the dev stack its --dev starts: help lists them only with
// --help-dev, so that the command's own flags are not lost among them.
const devStackFlag = "planex-dev-stack"

// shownWithDev are the dev stack flags help lists anyway: where the data
// goes and what is masked concern every --dev user.
var shownWithDev = []string{"data-dir", "redact-pattern"}

// groupDevFlags marks cmd's dev stack flags (those `planex dev` has too)
// for --help-dev and adds that flag; `cmd --help-dev` alone shows the help
// with them.
func groupDevFlags(cmd *cobra.Command) {
	var probe devFlags
	names := pflag.NewFlagSet("dev", pflag.ContinueOnError)
	probe.register(names, "probe")
	n := 0
	names.VisitAll(func(df *pflag.Flag) {
		if f := cmd.Flags().Lookup(df.Name); f != nil && !slices.Contains(shownWithDev, df.Name) {
			_ = cmd.Flags().SetAnnotation(df.Name, devStackFlag, []string{"true"})
			n++
		}
	})
	var helpDev bool
	cmd.Flags().BoolVar(&helpDev, "help-dev", false, fmt.Sprintf("help with the %d more flags that configure the dev stack of --dev (as for planex dev)", n))
	args, runE := cmd.Args, cmd.RunE
	cmd.Args = func(c *cobra.Command, a []string) error {
		if helpDev {
			return nil
		}
		if args == nil {
			return nil
		}
		return args(c, a)
	}
	cmd.RunE = func(c *cobra.Command, a []string) error {
		if helpDev {
			return c.Help()
		}
		return runE(c, a)
	}
}

// flagUsages renders the visible flags of fs, one per line, usage aligned.
// Dev stack flags are left out unless fs holds --help-dev set to true.
func flagUsages(fs *pflag.FlagSet) string {
	type row struct{ name, usage string }
	var rows []row
	width := 0
	withDev := false
	if f := fs.Lookup("help-dev"); f != nil && f.Value.String() == "true" {
		withDev = true
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || (!withDev && f.Annotations[devStackFlag] != nil) {
			return
		}
		name := "      --" + f.Name
		if f.Shorthand != "" && f.ShorthandDeprecated == "" {
			name = fmt.Sprintf("  -%s, --%s", f.Shorthand, f.Name)
		}
		varname, usage := pflag.UnquoteUsage(f)
		if varname != "" && f.Value.Type() != "bool" {
			name += " " + varname
		}
		if d := flagDefault(f); d != "" {
			usage += " (default " + d + ")"
		}
		if f.Deprecated != "" {
			usage += " (DEPRECATED: " + f.Deprecated + ")"
		}
		rows = append(rows, row{name, usage})
		width = max(width, len(name))
	})
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%-*s   %s\n", width, r.name, r.usage)
	}
	return b.String()
}

// flagDefault is a flag's default as help shows it: quoted for strings,
// empty when it is the type's zero value.
func flagDefault(f *pflag.Flag) string {
	switch f.DefValue {
	case "", "[]", "<nil>":
		return ""
	case "false", "0", "0s":
		if f.Value.Type() != "string" {
			return ""
		}
	}
	if f.Value.Type() == "string" {
		return fmt.Sprintf("%q", f.DefValue)
	}
	return f.DefValue
}
