//! A vocabulary's token texts as a byte trie, and the tokens a [`Matcher`] allows next:
//! one walk of the trie, a token's text shared with others stepped through once, and a
//! branch left as soon as the grammar refuses its bytes.

use super::matcher::{Matcher, DEAD};

/// Every token's text, by byte.
#[derive(Debug)]
pub struct TokenTrie {
    nodes: Vec<Node>,
}

#[derive(Debug, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    /// The tokens whose text ends here.
    tokens: Vec<u32>,
}

impl TokenTrie {
    /// The trie of `(token, text)` pairs (empty texts are left out: such a token writes
    /// nothing, which no grammar needs).
    pub fn new<'a>(pieces: impl IntoIterator<Item = (u32, &'a [u8])>) -> TokenTrie {
        let mut nodes = vec![Node::default()];
        for (token, text) in pieces {
            if text.is_empty() {
                continue;
            }
            let mut at = 0usize;
            for &b in text {
                let found = nodes[at].children.iter().find(|&&(c, _)| c == b);
                at = match found {
                    Some(&(_, child)) => child as usize,
                    None => {
                        let child = nodes.len();
                        nodes.push(Node::default());
                        nodes[at].children.push((b, child as u32));
                        child
                    }
                };
            }
            nodes[at].tokens.push(token);
        }
        TokenTrie { nodes }
    }
}

impl Matcher {
    /// Calls `allow` with each token of `trie` whose text the grammar allows next.
    pub fn allowed_tokens(&mut self, trie: &TokenTrie, mut allow: impl FnMut(u32)) {
        let mut todo = vec![(0u32, self.current())];
        while let Some((node, state)) = todo.pop() {
            for &(b, child) in &trie.nodes[node as usize].children {
                let next = self.step(state, b);
                if next == DEAD {
                    continue;
                }
                let child_node = &trie.nodes[child as usize];
                child_node.tokens.iter().for_each(|&t| allow(t));
                if !child_node.children.is_empty() {
                    todo.push((child, next));
                }
            }
        }
    }
}
