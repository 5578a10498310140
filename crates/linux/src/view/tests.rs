//! Unit tests of the view: mirrored stand-ins and the nested-run check.
