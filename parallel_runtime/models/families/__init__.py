"""Model families, one folder each: everything a family states (``spec.FamilySpec``) lives in its folder.

``registry`` lists the folders; everything else in the engine asks it. A folder holds the family's adapter
(``adapter.py``), its latent format and preview factors (``latent.py``), its original single-file layout and
conversion (``keys.py``), its prompt encoding (``text.py``), the shipped configs of its published variants
(``configs/<variant>/``) and its declaration (``spec.py``). ``docs/adding-a-family.md`` walks through one.
"""
