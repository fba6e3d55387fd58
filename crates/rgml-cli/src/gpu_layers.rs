//! `-ngl`'s value ([`GpuLayers`]): a leaf the flag definitions (`model_cmds`) and the
//! placement they lead to (`placement`) both read, so neither imports the other for it.

/// `-ngl`'s value, as llama.cpp spells it: a number of layers (the output head counted as
/// one), `all`, or `auto` (the default: every layer when there is a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuLayers {
    /// The default placement.
    Auto,
    /// Every block and the output head.
    All,
    /// This many layers.
    Count(usize),
}

impl GpuLayers {
    /// `-ngl`'s parser.
    pub fn parse(value: &str) -> Result<GpuLayers, String> {
        match value.trim() {
            "auto" => Ok(GpuLayers::Auto),
            "all" => Ok(GpuLayers::All),
            v => v
                .parse::<usize>()
                .map(GpuLayers::Count)
                .map_err(|_| format!("'{value}' is not a number of layers, 'all' or 'auto'")),
        }
    }

    /// The layers asked for (`None`: the default placement).
    pub fn count(self) -> Option<usize> {
        match self {
            GpuLayers::Auto => None,
            GpuLayers::All => Some(usize::MAX),
            GpuLayers::Count(n) => Some(n),
        }
    }
}

impl std::fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}
