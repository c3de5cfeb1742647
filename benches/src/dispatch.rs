//! Bench rows for the dispatch part (filled in by the dispatch work).
use crate::report::Record;

/// Runs this part's rows; `quick` shrinks sizes and time budgets.
pub fn rows(_quick: bool) -> Result<Vec<Record>, String> {
    Err("not wired yet".into())
}
