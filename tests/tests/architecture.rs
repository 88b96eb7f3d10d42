//! The house's rules, read from the code (ARCHITECTURE.md says why):
//! - no import circle between the files of a crate (a file's `use` lines and
//!   `crate::`/`super::`/`self::` paths, followed through `pub use`
//!   re-exports to the file that defines the name);
//! - every import goes to a lower floor of the crate's floor table in
//!   ARCHITECTURE.md, and every module of the crate has a floor there;
//! - the TFJob types and the controller carry none of the CLI's weight
//!   (`cargo tree`).
//!
//! Tests (`#[cfg(test)]` items, `tests.rs` files) are not read: a test may
//! reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose files are checked, with their source folders.
const CRATES: [(&str, &str); 4] =
    [("tfjob-runtime", "runtime/src"), ("tfjob-api", "operator/api/src"), ("tfjob-operator", "operator/controller/src"), ("tfjob", "operator/cli/src")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Module path (`["ps", "state"]`) of each library file, by file (relative
/// to the source folder). `main.rs` is a crate of its own and `tests.rs`
/// files are tests: neither is read.
fn module_files(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("source folder readable") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src").to_string_lossy().into_owned();
            if !rel.ends_with(".rs") || rel == "main.rs" || rel.ends_with("tests.rs") || rel.starts_with("bin/") {
                continue;
            }
            let mut segs: Vec<String> = rel.trim_end_matches(".rs").split('/').map(String::from).collect();
            if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
                segs.pop();
            }
            out.insert(rel, segs);
        }
    }
    out
}

/// The code with comments, string and char literals blanked (newlines kept).
fn blank_comments_and_literals(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
                out.push(' ');
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (next == Some('"') || (next == Some('#') && raw_string_start(&c, i + 1))) && !ident_char(c.get(i.wrapping_sub(1)).copied()) {
            let hashes = c[i + 1..].iter().take_while(|&&h| h == '#').count();
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let mut j = i + 2 + hashes;
            while j < c.len() && !c[j..].starts_with(&close) {
                j += 1;
            }
            for &ch in &c[i..(j + close.len()).min(c.len())] {
                blank(&mut out, ch);
            }
            i = j + close.len();
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            let mut j = i + 2;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            out.extend(std::iter::repeat_n(' ', j + 1 - i));
            i = j + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn raw_string_start(c: &[char], from: usize) -> bool {
    let hashes = c[from..].iter().take_while(|&&h| h == '#').count();
    c.get(from + hashes) == Some(&'"')
}

fn ident_char(ch: Option<char>) -> bool {
    ch.is_some_and(|ch| ch.is_alphanumeric() || ch == '_')
}

/// Byte index of the end of the item starting at `from`: the first `;` or
/// balanced `{...}` at depth 0.
fn item_end(code: &str, from: usize) -> usize {
    let mut depth = 0usize;
    for (i, ch) in code[from..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return from + i + 1;
                }
            }
            ';' if depth == 0 => return from + i + 1,
            _ => {}
        }
    }
    code.len()
}

/// The code without its `#[cfg(test)]` items, and without the paths of
/// visibilities (`pub(in crate::ps)` names no import).
fn without_test_items(code: &str) -> String {
    let mut out = code.to_string();
    while let Some(at) = out.find("pub(in ") {
        let end = at + out[at..].find(')').unwrap_or(out.len() - at);
        out.replace_range(at..=end, "pub");
    }
    while let Some(at) = out.find("#[cfg(test)]") {
        let end = item_end(&out, at + "#[cfg(test)]".len());
        out.replace_range(at..end, "");
    }
    out
}

/// One `use` declaration: whether it is public (`pub`, `pub(crate)`, ...)
/// and the paths it names (`self` in a group names the group's prefix).
struct UseDecl {
    public: bool,
    paths: Vec<Vec<String>>,
    span: (usize, usize),
}

fn use_decls(code: &str) -> Vec<UseDecl> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("use") {
        let at = from + found;
        from = at + 3;
        let word_before = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        if word_before || !bytes.get(at + 3).is_some_and(u8::is_ascii_whitespace) {
            continue;
        }
        let before = code[..at].trim_end();
        let restricted = before.ends_with(')') && before.rfind("pub(").is_some_and(|p| !before[p..].contains([';', '{', '}']));
        let public = before.ends_with("pub") || restricted;
        let start = if public { before.rfind("pub").unwrap_or(at) } else { at };
        let end = at + code[at..].find(';').unwrap_or(code.len() - at);
        let mut paths = Vec::new();
        expand_tree(&tidy(&code[at + 3..end]), &[], &mut paths);
        out.push(UseDecl { public, paths, span: (start, end) });
        from = end;
    }
    out
}

/// A use tree on one line, spaces only where they separate words (`x as y`).
fn tidy(tree: &str) -> String {
    let one_line = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    ["::", "{", "}", ","].iter().fold(one_line, |s, sep| s.replace(&format!(" {sep}"), sep).replace(&format!("{sep} "), sep))
}

/// Expands a use tree (`a::{b, c::{self, D}}`) into its paths; `x as y`
/// keeps `x`; globs are left out.
fn expand_tree(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let mut base = prefix.to_vec();
        base.extend(tree[..open].split("::").filter(|s| !s.is_empty()).map(String::from));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut last) = (0, 0);
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand_tree(&inner[last..i], &base, out);
                    last = i + 1;
                }
                _ => {}
            }
        }
        expand_tree(&inner[last..], &base, out);
        return;
    }
    let tree = tree.split(" as ").next().unwrap_or(tree).trim();
    if tree.is_empty() || tree.ends_with('*') {
        return;
    }
    let mut path = prefix.to_vec();
    path.extend(tree.split("::").filter(|s| !s.is_empty() && *s != "self").map(String::from));
    out.push(path);
}

/// `crate::`/`super::`/`self::` paths, and paths through a child module,
/// written in the code outside `use` declarations.
fn inline_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        if !(starts_word && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
                j += 1;
            }
            segs.push(code[s..j].to_string());
            if code[j..].starts_with("::") && code[j + 2..].starts_with(|c: char| c.is_alphabetic() || c == '_') {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 && (matches!(segs[0].as_str(), "crate" | "super" | "self") || children.contains(&segs[0])) {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

/// One crate's files as a graph: which file imports which, by which names.
struct Crate {
    /// file -> module path
    modules: BTreeMap<String, Vec<String>>,
    by_module: BTreeMap<Vec<String>, String>,
    /// module -> name -> path it re-exports (relative to that module)
    exports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
    /// file -> paths it names
    paths: BTreeMap<String, Vec<Vec<String>>>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let modules = module_files(src);
        let mut by_module: BTreeMap<Vec<String>, String> = modules.iter().map(|(f, m)| (m.clone(), f.clone())).collect();
        let mut exports = BTreeMap::new();
        let mut paths = BTreeMap::new();
        for (file, module) in &modules {
            let code = without_test_items(&blank_comments_and_literals(&std::fs::read_to_string(src.join(file)).expect("source readable")));
            // Inline modules (`pub mod proto { ... }`) are nodes of their own, in their file.
            for (at, _) in code.match_indices("mod ") {
                let rest = &code[at + 4..];
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && rest[name.len()..].trim_start().starts_with('{') {
                    let mut m = module.clone();
                    m.push(name.clone());
                    by_module.entry(m).or_insert_with(|| format!("{file}::{name}"));
                }
            }
            let decls = use_decls(&code);
            let mut rest = code.clone();
            for d in decls.iter().rev() {
                rest.replace_range(d.span.0..d.span.1, "");
            }
            let mut file_paths: Vec<Vec<String>> = decls.iter().flat_map(|d| d.paths.clone()).collect();
            let children: BTreeSet<String> =
                by_module.keys().filter(|m| m.len() == module.len() + 1 && m.starts_with(module)).map(|m| m[module.len()].clone()).collect();
            file_paths.extend(inline_paths(&rest, &children));
            let reexports: BTreeMap<String, Vec<String>> =
                decls.iter().filter(|d| d.public).flat_map(|d| d.paths.iter().filter_map(|p| Some((p.last()?.clone(), p.clone())))).collect();
            exports.insert(module.clone(), reexports);
            paths.insert(file.clone(), file_paths);
        }
        Crate { modules, by_module, exports, paths }
    }

    /// The module a path from `module` names: followed through modules, and
    /// through re-exports to where the name is defined. `None`: outside the crate.
    fn resolve(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        let mut cur = module.to_vec();
        let mut segs = path.iter().peekable();
        match segs.peek()?.as_str() {
            "crate" => {
                cur.clear();
                segs.next();
            }
            "self" => {
                segs.next();
            }
            "super" => {}
            first if self.by_module.contains_key(&[module, &[first.to_string()]].concat()) => {}
            _ => return None,
        }
        for seg in segs {
            if seg == "super" {
                cur.pop();
                continue;
            }
            let mut child = cur.clone();
            child.push(seg.clone());
            if self.by_module.contains_key(&child) {
                cur = child;
                continue;
            }
            if let Some(target) = self.exports.get(&cur).and_then(|e| e.get(seg))
                && depth < 8
                && let Some(to) = self.resolve(&cur, target, depth + 1)
            {
                return Some(to);
            }
            break;
        }
        Some(cur)
    }

    /// file -> the files it imports, with the names that tie them.
    fn edges(&self) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (file, module) in &self.modules {
            let entry = out.entry(file.clone()).or_default();
            for path in &self.paths[file] {
                let Some(to) = self.resolve(module, path, 0) else { continue };
                let Some(to_file) = self.by_module.get(&to) else { continue };
                if to_file != file && !to_file.starts_with(&format!("{file}::")) {
                    entry.entry(to_file.clone()).or_default().insert(path.join("::"));
                }
            }
        }
        out
    }
}

/// The strongly connected components of more than one file (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flat_map(|m| m.keys()) {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), found: Vec::new() };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The top-level module a file belongs to (`ps` for `ps/state/training.rs`,
/// `proto` for the crate root's inline `lib.rs::proto`, `lib` for the crate
/// root itself).
fn top_module(file: &str) -> String {
    match file.split_once("::") {
        Some(("lib.rs", inline)) => inline.to_string(),
        Some((file, _)) => top_module(file),
        None => file.split('/').next().unwrap_or(file).trim_end_matches(".rs").to_string(),
    }
}

/// The floor table of `src` in ARCHITECTURE.md: the lines after
/// `<!-- floors: SRC -->` of the form `| N | `a`, `b` |`.
fn floor_table(src: &str) -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md at the repository's root");
    let marker = format!("<!-- floors: {src} -->");
    let at = doc.find(&marker).unwrap_or_else(|| panic!("ARCHITECTURE.md has no floor table for {src} (a line {marker:?} above it)"));
    let mut floors = BTreeMap::new();
    for line in doc[at + marker.len()..].lines().skip_while(|l| l.trim().is_empty()).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(floor) = cells.get(1).and_then(|c| c.parse::<u32>().ok()) else { continue };
        for name in cells.get(2).unwrap_or(&"").split('`').skip(1).step_by(2) {
            floors.insert(name.to_string(), floor);
        }
    }
    floors
}

fn describe(edges: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>, component: &[String]) -> String {
    let mut out = String::new();
    for from in component {
        for (to, names) in &edges[from] {
            if component.contains(to) {
                out.push_str(&format!("\n    {from} -> {to} ({})", names.iter().cloned().collect::<Vec<_>>().join(", ")));
            }
        }
    }
    out
}

#[test]
fn no_file_imports_another_that_imports_it_back() {
    let mut report = String::new();
    for (name, src) in CRATES {
        let krate = Crate::read(&repo().join(src));
        assert!(krate.modules.len() > 2, "{src}: read {} files", krate.modules.len());
        let edges = krate.edges();
        for component in circles(&edges) {
            report.push_str(&format!("\n{name}: a circle of {} files:{}", component.len(), describe(&edges, &component)));
        }
    }
    assert!(report.is_empty(), "import circles (move what both sides share into a file of its own):{report}");
}

#[test]
fn every_import_goes_down_the_floor_table_of_architecture_md() {
    let mut report = String::new();
    for (name, src) in CRATES {
        let floors = floor_table(src);
        let krate = Crate::read(&repo().join(src));
        let edges = krate.edges();
        let floor_of = |file: &str| floors.get(&top_module(file)).copied();
        for file in edges.keys().chain(krate.by_module.values()) {
            if top_module(file) != "lib" && floor_of(file).is_none() {
                report.push_str(&format!("\n{name}: {src}/{file}: module `{}` has no floor in ARCHITECTURE.md", top_module(file)));
            }
        }
        for (from, tos) in &edges {
            for (to, names) in tos {
                let (Some(a), Some(b)) = (floor_of(from), floor_of(to)) else { continue };
                if top_module(from) != top_module(to) && b >= a {
                    let names = names.iter().cloned().collect::<Vec<_>>().join(", ");
                    report.push_str(&format!("\n{name}: {from} (floor {a}) imports {to} (floor {b}): {names}"));
                }
            }
        }
    }
    assert!(report.is_empty(), "imports that do not go down a floor (move the code, or the module's floor in ARCHITECTURE.md):{report}");
}

/// What each crate must not link, by `cargo tree` of its normal dependencies.
#[test]
fn the_api_and_the_controller_carry_none_of_the_clis_weight() {
    let cases: [(&str, &[&str]); 2] = [
        ("tfjob-api", &["tokio", "hyper", "kube-client", "kube-runtime", "tower", "axum", "tonic", "bollard", "plotters"]),
        ("tfjob-operator", &["bollard", "plotters", "plotters-bitmap", "ab_glyph", "tfjob-runtime"]),
    ];
    for (package, banned) in cases {
        let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["tree", "--locked", "--offline", "-p", package, "-e", "normal", "--prefix", "none"])
            .current_dir(repo())
            .output()
            .expect("cargo runs");
        assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8_lossy(&out.stdout);
        let linked: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        assert!(linked.contains(package), "cargo tree -p {package} lists the package itself:\n{tree}");
        let found: Vec<&&str> = banned.iter().filter(|b| linked.contains(**b)).collect();
        assert!(found.is_empty(), "{package} depends on {found:?} (cargo tree -p {package} -e normal -i NAME shows through what)");
    }
}

#[test]
fn the_reader_sees_through_faces_and_tells_circles() {
    // A face re-exports; a child importing a sibling through it is no circle.
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |rel: &str, code: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, code).expect("write");
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write("a/mod.rs", "mod x;\nmod y;\npub use x::X;\npub use y::Y;\n");
    write("a/x.rs", "// use super::Y; in a comment\npub struct X;\nconst S: &str = \"crate::b::B\";\n");
    write("a/y.rs", "use super::X;\npub struct Y(X);\n#[cfg(test)]\nmod t { use crate::b::B; }\n");
    write("b.rs", "use crate::a::Y;\npub struct B(Y);\n");
    let krate = Crate::read(dir.path());
    let edges = krate.edges();
    assert_eq!(edges["a/y.rs"].keys().collect::<Vec<_>>(), ["a/x.rs"], "through the face to the file that defines X");
    assert_eq!(edges["b.rs"].keys().collect::<Vec<_>>(), ["a/y.rs"]);
    assert!(edges["a/x.rs"].is_empty(), "comments, strings and tests are not read: {edges:?}");
    assert!(circles(&edges).is_empty(), "{edges:?}");
    // A parent that defines what its child imports, and imports the child: a circle.
    write("a/mod.rs", "mod x;\nmod y;\npub use x::X;\npub use y::Y;\npub struct Z;\n");
    write("a/x.rs", "pub struct X(super::Z);\n");
    let edges = Crate::read(dir.path()).edges();
    assert_eq!(circles(&edges).len(), 1, "{edges:?}");
}
