//! The one printer of the simulator's tables: a title, a header line and rows of cells
//! joined by ` | `, each column padded to its width, and an optional trailing series
//! (the success rate second by second) after the last column.

use std::fmt::{self, Write as _};

/// Which side of its column a cell's text keeps to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Align {
    Left,
    Right,
}

/// A column: its header and the width its header and cells are padded to.
#[derive(Clone, Debug)]
pub(crate) struct Column {
    header: String,
    width: usize,
    align: Align,
}

impl Column {
    /// A column whose text keeps to the left.
    pub(crate) fn left(header: impl Into<String>, width: usize) -> Column {
        Column {
            header: header.into(),
            width,
            align: Align::Left,
        }
    }

    /// A column whose text keeps to the right (numbers).
    pub(crate) fn right(header: impl Into<String>, width: usize) -> Column {
        Column {
            header: header.into(),
            width,
            align: Align::Right,
        }
    }
}

/// One table as printed: rows of already formatted cells, one per column.
#[derive(Debug)]
pub(crate) struct TextTable {
    title: String,
    columns: Vec<Column>,
    /// The header of the series printed after the last column, if rows have one.
    series: Option<&'static str>,
    rows: Vec<(Vec<String>, Option<String>)>,
}

impl TextTable {
    /// An empty table under `title`.
    pub(crate) fn new(title: impl Into<String>, columns: Vec<Column>) -> TextTable {
        TextTable {
            title: title.into(),
            columns,
            series: None,
            rows: Vec::new(),
        }
    }

    /// Rows end with a series headed `header` (see [`row_with_series`](Self::row_with_series)).
    pub(crate) fn with_series(mut self, header: &'static str) -> TextTable {
        self.series = Some(header);
        self
    }

    /// Adds a row of `cells`, one per column.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push((cells, None));
    }

    /// Adds a row of `cells` followed by the success rates `shares` as whole percents.
    pub(crate) fn row_with_series(&mut self, cells: Vec<String>, shares: &[f64]) {
        let mut series = String::new();
        for s in shares {
            let _ = write!(series, "{:>4.0}", s * 100.0);
        }
        self.rows.push((cells, Some(series)));
    }

    fn write_cells<'a>(
        &self,
        f: &mut fmt::Formatter<'_>,
        cells: impl Iterator<Item = &'a str>,
    ) -> fmt::Result {
        for (i, (column, cell)) in self.columns.iter().zip(cells).enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            match column.align {
                Align::Left => write!(f, "{cell:<w$}", w = column.width)?,
                Align::Right => write!(f, "{cell:>w$}", w = column.width)?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for TextTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        self.write_cells(f, self.columns.iter().map(|c| c.header.as_str()))?;
        if let Some(header) = self.series {
            write!(f, " | {header}")?;
        }
        writeln!(f)?;
        for (cells, series) in &self.rows {
            self.write_cells(f, cells.iter().map(String::as_str))?;
            if let Some(series) = series {
                write!(f, " |{series}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// `share` as a percent with `decimals` decimals and a `%` sign.
pub(crate) fn percent(share: f64, decimals: usize) -> String {
    format!("{:.decimals$}%", share * 100.0)
}

/// `x` with `decimals` decimals.
pub(crate) fn fixed(x: f64, decimals: usize) -> String {
    format!("{x:.decimals$}")
}

/// Seconds to recover, whole, or `never`.
pub(crate) fn seconds_or_never(seconds: Option<f64>) -> String {
    seconds.map_or("never".to_owned(), |s| format!("{s:.0}"))
}

#[cfg(test)]
mod tests;
