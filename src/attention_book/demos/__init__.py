"""Interactive demos that need no kernel: HTML with a little JavaScript.

Each function returns an ``IPython.display.HTML`` object. Its first rendering
is computed here in Python, so the page teaches even with scripts off; the
script then recomputes the same formula in the browser whenever the
reader moves the control. That keeps the demos alive on the static website,
where no Python runs behind an ipywidget.

One module per demo (``temperature``, ``mask_editor``, ``query_picker``, ``ambiguity``, and
``induction``, which trains chapter 15's model in the page); the
CSS and JavaScript are real files in ``assets/``, shipped with the package and read with
``importlib.resources`` (``page``). Every demo's root element carries the CSS class
``ab-demo`` and a ``data-demo`` attribute naming it; the part that changes has the class
``ab-demo-output``. Element ids derive from ``element_id`` only, so the stored notebook output
is the same on every run. In a notebook whose scripts do not run (Jupyter does not run the
stored scripts of a notebook it does not trust), one line says to run the cell; the script
removes that line as it starts.
"""

from __future__ import annotations

from .ambiguity import (
    CLEAR_FOCUS,
    EXPORT_DECIMALS,
    SentenceReading,
    ambiguity_demo,
    classifier_from_export,
    export_classifier,
    read_sentence,
)
from .induction import (
    DEMO_SETTINGS,
    demo_model,
    demo_probe,
    export_parameters,
    induction_training_demo,
    parameters_from_export,
)
from .mask_editor import mask_editor_demo
from .query_picker import query_picker_demo
from .temperature import temperature_demo

__all__ = [
    "temperature_demo",
    "mask_editor_demo",
    "query_picker_demo",
    "SentenceReading",
    "read_sentence",
    "export_classifier",
    "classifier_from_export",
    "ambiguity_demo",
    "EXPORT_DECIMALS",
    "CLEAR_FOCUS",
    "DEMO_SETTINGS",
    "demo_model",
    "demo_probe",
    "export_parameters",
    "parameters_from_export",
    "induction_training_demo",
]
