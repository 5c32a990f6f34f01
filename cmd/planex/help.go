package main

import (
	"fmt"
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

// flagUsages renders the visible flags of fs, one per line, usage aligned.
func flagUsages(fs *pflag.FlagSet) string {
	type row struct{ name, usage string }
	var rows []row
	width := 0
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
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
