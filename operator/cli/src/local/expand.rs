//! The kubelet's `$(VAR)` expansion of a container's env values, `command`
//! and `args`, so that both local backends (and the test node agent, which
//! plays the kubelet) run a manifest as a cluster would.
//!
//! The rules are those of Kubernetes' `third_party/forked/golang/expansion`,
//! written here from its specification and tests:
//! - `$(NAME)` is replaced by the value of `NAME` when it is defined, and
//!   left as written when it is not (nor is the value expanded again);
//! - `$$` is an escaped `$`: `$$(NAME)` gives `$(NAME)`;
//! - `$(` without a closing `)` stays as written, and so does a `$` before
//!   any other character (`$x`, `${x}`, `$?`) or at the end;
//! - the name is everything between `$(` and the next `)`, whatever it holds.
//!
//! Env values may refer to the variables defined before them ([`Environment`]),
//! `command` and `args` to every variable of the container.

use std::collections::HashMap;

/// `input` with every `$(NAME)` for which `lookup` has a value replaced by it.
pub fn expand<'v>(input: &str, lookup: impl Fn(&str) -> Option<&'v str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let mut chars = after.chars();
        match chars.next() {
            // A `$` at the very end stays.
            None => {
                out.push('$');
                rest = after;
            }
            Some('$') => {
                out.push('$');
                rest = &after[1..];
            }
            Some('(') => match after[1..].find(')') {
                Some(close) => {
                    let name = &after[1..1 + close];
                    match lookup(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &after[close + 2..];
                }
                // Incomplete: `$(` stays and the text after it is read on.
                None => {
                    out.push_str("$(");
                    rest = &after[1..];
                }
            },
            Some(other) => {
                out.push('$');
                out.push(other);
                rest = chars.as_str();
            }
        }
    }
    out.push_str(rest);
    out
}

/// A container's environment as the kubelet builds it: variables in order,
/// each manifest `value` expanded against the variables defined before it.
/// A name defined again takes the new value in its first place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl Environment {
    pub fn new() -> Self {
        Self::default()
    }

    /// The literal env of a planned replica (manifest `value`s, then what
    /// the operator sets), each value expanded as the kubelet does.
    pub fn of_values<'a>(vars: impl IntoIterator<Item = &'a (String, String)>) -> Self {
        let mut env = Environment::new();
        for (name, value) in vars {
            env.define_value(name, value);
        }
        env
    }

    /// Variables whose values are final (already expanded, or never to be).
    pub fn of_expanded<'a>(vars: impl IntoIterator<Item = &'a (String, String)>) -> Self {
        let mut env = Environment::new();
        for (name, value) in vars {
            env.define(name, value.clone());
        }
        env
    }

    /// A manifest `value`: expanded against the variables defined so far.
    pub fn define_value(&mut self, name: &str, value: &str) {
        let expanded = expand(value, |n| self.get(n));
        self.define(name, expanded);
    }

    /// A value taken as it is (the kubelet does not expand values read from
    /// a Secret, a ConfigMap or the downward API).
    pub fn define(&mut self, name: &str, value: String) {
        match self.index.get(name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.to_string(), self.vars.len());
                self.vars.push((name.to_string(), value));
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }

    /// `command` or `args` with their references to these variables expanded.
    pub fn expand_all(&self, items: &[String]) -> Vec<String> {
        items.iter().map(|s| expand(s, |n| self.get(n))).collect()
    }

    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    pub fn into_vars(self) -> Vec<(String, String)> {
        self.vars
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_table() {
        let vars: HashMap<&str, &str> = [("A", "a"), ("B", "b"), ("EMPTY", ""), ("REF", "$(A)"), ("É", "e")].into_iter().collect();
        let lookup = |n: &str| vars.get(n).copied();
        // (input, expanded)
        let cases = [
            ("$(A)", "a"),
            ("$(A)-$(A)", "a-a"),
            ("--ps_hosts=$(A),$(B)", "--ps_hosts=a,b"),
            ("x$(EMPTY)y", "xy"),
            // Unknown: left as written.
            ("$(NOPE)", "$(NOPE)"),
            ("$()", "$()"),
            // `$$` escapes.
            ("$$", "$"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$a"),
            ("$$$$(A)", "$$(A)"),
            ("$$$$$$(NOPE)", "$$$(NOPE)"),
            ("$$$$$$$(A)", "$$$a"),
            ("cost: $$5", "cost: $5"),
            // Incomplete or no reference: stays.
            ("$(A", "$(A"),
            ("$(", "$("),
            ("$(A)__$(", "a__$("),
            ("--$($($(--", "--$($($(--"),
            ("$", "$"),
            ("a$", "a$"),
            ("$x", "$x"),
            ("$A", "$A"),
            ("${A}", "${A}"),
            ("$?_$!", "$?_$!"),
            ("$A)", "$A)"),
            ("$é$(É)", "$ée"),
            // Not recursive; names are everything up to the first `)`.
            ("$(REF)", "$(A)"),
            ("$(A$(B))", "$(A$(B))"),
            ("$(x$$y)", "$(x$$y)"),
            ("back\\$(A)", "back\\a"),
            ("no references", "no references"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, lookup), want, "{input:?}");
        }
    }

    #[test]
    fn env_values_see_the_variables_before_them() {
        let literal = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let env = Environment::of_values(&literal(&[
            ("HOSTS", "h:1,h:2"),
            ("FLAGS", "--worker_hosts=$(HOSTS) --job=$(JOB)"),
            ("JOB", "worker"),
            ("ESCAPED", "$$(HOSTS)"),
            ("SELF", "x$(SELF)"),
        ]));
        assert_eq!(env.get("FLAGS"), Some("--worker_hosts=h:1,h:2 --job=$(JOB)"), "JOB is defined after FLAGS");
        assert_eq!(env.get("ESCAPED"), Some("$(HOSTS)"));
        assert_eq!(env.get("SELF"), Some("x$(SELF)"));
        let args = env.expand_all(&["--job_name=$(JOB)".into(), "$(FLAGS)".into(), "$(UNSET)".into()]);
        assert_eq!(args, ["--job_name=worker", "--worker_hosts=h:1,h:2 --job=$(JOB)", "$(UNSET)"]);

        // Defined again: the new value in the first place; a value taken as
        // it is (from a Secret) is not expanded.
        let mut env = Environment::of_values(&literal(&[("A", "1"), ("B", "2")]));
        env.define_value("A", "$(B)3");
        env.define("TOKEN", "$(A)".into());
        assert_eq!(env.vars(), literal(&[("A", "23"), ("B", "2"), ("TOKEN", "$(A)")]).as_slice());
    }
}
